"""A case made ready to judge: its inputs, the float64 reference and the naive baseline's errors, once per case."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.oracle.reference import Reference
from harness.oracle.verdict import NAIVE_BOUND, Check, identical, judge
from harness.cases.case import AttentionCase, Inputs
from harness.store.schema import BASELINE


#: the largest answer judged_timed keeps (bytes): a mid-size CPU key's gradients are ~0.2-0.4 MiB, and judging one
#: against the float64 reference costs ~0.3 ms where a bit-for-bit look costs ~0.03 ms; a large GPU case's answers
#: would crowd its float64 references out of the run's cache
TIMED_MEMO_BYTES = 4 * 2 ** 20


@dataclass
class PreparedCase:
    """Inputs (on the device), the float64 reference and the naive errors, computed once per case."""

    case: AttentionCase
    device: torch.device
    inputs: Inputs
    reference: Reference
    naive_errors: dict[str, float] | None
    naive_note: str = ""
    #: the inputs are make_inputs(case, device, seed) (a worker can draw them itself); None: given inputs
    seed: int | None = None
    #: how the baseline was computed (oracle.baseline: dense or chunked), or why the fixed bound stands in
    baseline: str = ""
    #: an FP8 KV case's quantization error of the output against the unquantized reference (spec.fp8), else None
    quant_err: float | None = None
    #: max |reference| by quantity, read once: a timed key's answers are all judged against the same reference
    _largest: dict[str, float] = field(default_factory=dict, repr=False)
    #: the last timed answer judged by (backend, quantity), a copy of its own, and its Check (judged_timed)
    _timed: dict[tuple[str, str], tuple[torch.Tensor, Check]] = field(default_factory=dict, repr=False)

    def largest(self, quantity: str) -> float:
        """max |reference of `quantity`| (0 when it has no entries)."""
        if quantity not in self._largest:
            ref = self.reference.get(quantity)
            self._largest[quantity] = float(ref.abs().max()) if ref.numel() else 0.0
        return self._largest[quantity]

    def naive_error(self, quantity: str, backend_name: str) -> float | None:
        """The baseline error a backend's tolerance is built from: None for naive itself, the naive bound at this
        quantity's magnitude without a usable baseline."""
        if backend_name == BASELINE:
            return None
        if self.naive_errors is not None and quantity in self.naive_errors:
            return self.naive_errors[quantity]
        return NAIVE_BOUND[self.case.dtype] * max(1.0, self.largest(quantity), self.reference.terms_of(quantity))

    def judged(self, quantity: str, actual: torch.Tensor, backend_name: str) -> Check:
        """`actual` (canonical layout, the whole quantity) of `backend_name` against this case's reference under the
        rule: its naive error, and for dq and dk the size of the terms they cancel (Reference.terms_of)."""
        return judge(quantity, actual, self.reference.get(quantity), self.case.dtype,
                     self.naive_error(quantity, backend_name), terms=self.reference.terms_of(quantity),
                     ref_largest=self.largest(quantity))

    def judged_timed(self, quantity: str, actual: torch.Tensor, backend_name: str) -> Check:
        """`judged`, with a memo: an answer bit for bit the last one of `backend_name` and `quantity` judged has its
        verdict (a deterministic kernel's timed answers, their contents divided out, are one across a key's calls and
        rounds). The memo keeps its own copy, made before judging, whoever holds the answer it was handed (a reply's
        tensors are copied out of the backend's arena as they are read, isolation/wire.py `Channel`). Answers over
        TIMED_MEMO_BYTES are not kept: a case's memo counts against the run's cache of prepared cases
        (calls/cache.py)."""
        known = self._timed.get((backend_name, quantity))
        if known is not None and identical(known[0], actual):
            return known[1]
        own = actual.clone()
        check = self.judged(quantity, own, backend_name)
        if own.numel() * own.element_size() <= TIMED_MEMO_BYTES:
            self._timed[(backend_name, quantity)] = (own, check)
        return check

    def memo_bytes(self) -> int:
        """What judged_timed's memo holds (bytes)."""
        return sum(t.numel() * t.element_size() for t, _ in self._timed.values())

    def note_for(self, backend_name: str) -> str:
        """What every verdict of `backend_name` on this case must mention about its baseline ('' when usable)."""
        return self.naive_note if backend_name != BASELINE else ""
