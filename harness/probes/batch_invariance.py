"""Batch invariance: one sequence's output alone and co-batched, compared bitwise; recorded (observed)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

from harness.backends.base import Backend
from harness.calls.bound import BoundCall, backend_inputs
from harness.calls.call import Call
from harness.isolation.executor import Executor, make_executor
from harness.probes.common import probe_dtype, probe_row, refused
from harness.cases.case import AttentionCase, Inputs, make_inputs, paged_case
from harness.cases.masks import And, Causal, KeyPadding, MaskSpec
from harness.cases.masks.padding import PerSequenceLengths
from harness.cases.masks.cache_causal import cache_lengths
from harness.store.schema import ERROR, FWD, OBSERVED, Row

KINDS = ("prefill", "decode", "paged-decode")


def invariance_case(kind: str, dtype: torch.dtype, device: torch.device) -> AttentionCase:
    """Three sequences of different lengths, the first the longest; several kernel tiles long on a GPU."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; allowed: {', '.join(KINDS)}")
    n = 1024 if device.type == "cuda" else 129
    lengths = cache_lengths(4 * n, 3)
    if kind == "prefill":
        return AttentionCase(3, 4, n, 64, dtype, mask=Causal() & KeyPadding((n, n - 37, n // 2)))
    if kind == "decode":
        return AttentionCase(3, 8, 1, 64, dtype, kv_heads=2, seq_k=max(lengths), mask=KeyPadding(lengths))
    return paged_case(3, 8, 1, 64, dtype, kv_heads=2, cache=4 * n, page_size=16)


def _first(mask: MaskSpec | None) -> MaskSpec | None:
    """The mask of sequence 0 alone: per-sequence lengths cut to the first."""
    if isinstance(mask, PerSequenceLengths):
        return type(mask)(mask.lengths[:1])
    return And(_first(mask.first), _first(mask.second)) if isinstance(mask, And) else mask


def alone(case: AttentionCase, inputs: Inputs) -> tuple[AttentionCase, Inputs]:
    """Sequence 0 of `case` as a batch of one, and its inputs (the batch's first slice)."""
    return replace(case, batch=1, mask=_first(case.mask)), Inputs(*(t[:1] for t in inputs[:4]))


def compare(batched_first: torch.Tensor, single: torch.Tensor) -> tuple[bool, str]:
    """(bitwise equal, what was seen) of sequence 0's output co-batched and alone."""
    if torch.equal(batched_first, single):
        return True, "bitwise equal alone and co-batched"
    worst = float((batched_first.double() - single.double()).abs().max())
    return False, f"differs alone vs co-batched (max |diff| {worst:.3g})"


def check_batch_invariance(backend: Backend, kind: str, device: torch.device, *, seed: int = 0, run_id: str = "",
                           executor: Executor | None = None) -> Row:
    """One 'batch-invariance-<kind>:<case id>' fwd row: observed (or why it could not run)."""
    executor = executor if executor is not None else make_executor()
    case = invariance_case(kind, probe_dtype(backend, device), device)
    row = partial(probe_row, case, backend, device, tag=f"batch-invariance-{kind}", phase=FWD, run_id=run_id)
    inputs = make_inputs(case, "cpu", seed)
    pair = ((case, inputs), alone(case, inputs))
    if gate := refused(backend, case, device, executor) or refused(backend, pair[1][0], device, executor):
        return row(status=gate[0], reason=gate[1])
    outs = []
    for c, x in pair:
        answer = executor.call(backend, Call(c, None, x), device)
        if answer.failure is not None:
            return row(status=ERROR, reason=answer.failure.reason)
        outs.append(answer.out)
    _, seen = compare(outs[0][:1], outs[1])
    return row(status=OBSERVED, observed=seen, reason="recorded: no backend promises batch invariance")


def batch_invariance_check(backend: Backend, device: torch.device, case: AttentionCase, seed: int = 0) -> dict:
    """The advisor's check on its workload, in this process: {batch_invariant: yes/no/error, batch_invariance_note}."""
    try:
        inputs = make_inputs(case, device, seed)
        outs = []
        for c, x in ((case, inputs), alone(case, inputs)):
            q, k, v, _ = backend_inputs(backend, c, x, requires_grad=False)
            with torch.no_grad():
                outs.append(backend.from_layout(BoundCall(backend, c, device)(q, k, v)).detach().cpu())
        same, note = compare(outs[0][:1], outs[1])
        return {"batch_invariant": "yes" if same else "no", "batch_invariance_note": note}
    except Exception as exc:
        return {"batch_invariant": "error", "batch_invariance_note": f"{type(exc).__name__}: {str(exc)[:200]}"}
