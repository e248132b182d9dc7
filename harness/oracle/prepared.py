"""A case made ready to judge: its inputs, the float64 reference and the naive baseline's errors, once per case."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.oracle.reference import Reference
from harness.oracle.verdict import CONTENT_SPREAD, NAIVE_BOUND, Check, judge
from harness.cases.case import AttentionCase, Inputs, make_inputs
from harness.store.schema import BASELINE


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
    #: max |reference| by quantity, read once: every backend's answers are judged against the same reference
    _largest: dict[str, float] = field(default_factory=dict, repr=False)
    #: the verified inputs' sinks and bias, kept once read (modifiers)
    _modifiers: tuple | None = field(default=None, repr=False)

    def largest(self, quantity: str) -> float:
        """max |reference of `quantity`| (0 when it has no entries)."""
        if quantity not in self._largest:
            self._largest[quantity] = _largest(self.reference.get(quantity))
        return self._largest[quantity]

    def modifiers(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The verified inputs' sinks and bias (every timed call's content keeps them): drawn again from the seed,
        once, when this copy no longer holds its inputs (a worker draws them from the same seed)."""
        if self._modifiers is None:
            inputs = self.inputs
            if inputs is None and (self.case.sinks or self.case.bias is not None):
                inputs = make_inputs(self.case, self.device, self.seed)
            self._modifiers = (None, None) if inputs is None else (inputs.sinks, inputs.bias)
        return self._modifiers

    def naive_error(self, quantity: str, backend_name: str) -> float | None:
        """The baseline error a backend's tolerance is built from: None for naive itself, the naive bound at this
        quantity's magnitude without a usable baseline."""
        if backend_name == BASELINE:
            return None
        if self.naive_errors is not None and quantity in self.naive_errors:
            return self.naive_errors[quantity]
        return NAIVE_BOUND[self.case.dtype] * max(1.0, self.largest(quantity), self.reference.terms_of(quantity))

    def judged(self, quantity: str, actual: torch.Tensor, backend_name: str,
               reference: Reference | None = None) -> Check:
        """`actual` (canonical layout, the whole quantity) of `backend_name` against this case's reference under the
        rule: its naive error, and for dq and dk the size of the terms they cancel (Reference.terms_of);
        `reference`: another content's (a timed call's, run/judge.py), its slice's if `actual` is one, judged under
        this case's naive error (the same distribution of inputs) counted CONTENT_SPREAD times."""
        ref = self.reference if reference is None else reference
        largest = self.largest(quantity) if reference is None else _largest(reference.get(quantity))
        return judge(quantity, actual, ref.get(quantity), self.case.dtype, self.naive_error(quantity, backend_name),
                     terms=ref.terms_of(quantity), ref_largest=largest,
                     spread=1.0 if reference is None else CONTENT_SPREAD)

    def note_for(self, backend_name: str) -> str:
        """What every verdict of `backend_name` on this case must mention about its baseline ('' when usable)."""
        return self.naive_note if backend_name != BASELINE else ""


def _largest(ref: torch.Tensor) -> float:
    return float(ref.abs().max()) if ref.numel() else 0.0
