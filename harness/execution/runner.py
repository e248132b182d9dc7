"""Runs one backend on one case: forward and backward judged against the prepared reference, a row per phase."""

from __future__ import annotations

import torch

from harness.backends.base import Backend
from harness.backends.registry import all_backends
from harness.execution.call import Arrangement, BoundCall, backend_inputs
from harness.execution.outcome import BackendResult, failure_status, free
from harness.oracle.prepared import BASELINE_BACKEND, PreparedCase
from harness.oracle.reference import reference_attention
from harness.oracle.verdict import Check, judge
from harness.spec.case import AttentionCase, Inputs, make_inputs
from harness.store.rows import make_row
from harness.store.schema import GRADS, QUANTITIES, Row


def verdict_row(prepared: PreparedCase, backend: Backend, phase: str, status: str, reason: str = "",
                checks: list[Check] | None = None, run_id: str = "") -> Row:
    """A correctness row of `backend` on the prepared case; the op that ran is named when it produced an answer."""
    return make_row(run_id=run_id, case=prepared.case, backend=backend.name, backend_version=backend.version(),
                    phase=phase, device=prepared.device, status=status, reason=reason, checks=checks or (),
                    backend_op=backend.last_op() if status in ("pass", "fail") else "")


def prepare_case(case: AttentionCase, device: torch.device, seed: int = 0, *, inputs: Inputs | None = None,
                 reference_inputs: Inputs | None = None) -> PreparedCase:
    """Inputs (seeded randn unless given), the float64 reference and the naive errors for `case`.

    `reference_inputs` (default: the inputs) feed the reference and the naive baseline, so values that must
    not matter (NaN in storage beyond the end) can be kept out of them.
    """
    inputs = make_inputs(case, device, seed) if inputs is None else inputs
    clean = inputs if reference_inputs is None else reference_inputs
    prepared = PreparedCase(case, device, clean, reference_attention(case, clean), None)
    result = execute(all_backends()[BASELINE_BACKEND], prepared)
    if result.status == "pass" and set(result.checks) == set(QUANTITIES):
        prepared.naive_errors = {q: c.err for q, c in result.checks.items()}
    else:
        # Without a trustworthy same-precision baseline, fall back to the naive bound as its stand-in.
        prepared.naive_note = f"naive baseline unusable ({result.status}: {result.reasons}); tolerance uses NAIVE_BOUND"
    prepared.inputs = inputs
    return prepared


def refusal(backend: Backend, case: AttentionCase, device: torch.device) -> tuple[str, str] | None:
    """(status, reason) when `backend` cannot run `case`'s forward on `device` at all, else None."""
    reason = backend.unavailable_reason(device)
    if reason:
        return "unavailable", reason
    reasons = backend.can_run(case, device)
    return ("unsupported", "; ".join(reasons)) if reasons else None


def execute(backend: Backend, prepared: PreparedCase, run_id: str = "", *,
            arrangement: Arrangement | None = None) -> BackendResult:
    """Run forward and backward of `backend` on the prepared case and judge both phases against the reference."""
    case, device = prepared.case, prepared.device

    def both(status: str, reason: str) -> BackendResult:
        return BackendResult([verdict_row(prepared, backend, p, status, reason, run_id=run_id) for p in ("fwd", "bwd")])

    refused = refusal(backend, case, device)
    if refused:
        return both(*refused)
    bwd_reason = "; ".join(backend.backward_reasons(device))
    note = prepared.note_for(backend.name)

    q, k, v, d_out = backend_inputs(backend, prepared.inputs, requires_grad=not bwd_reason)
    try:
        out = BoundCall(backend, case, device, arrangement)(q, k, v)
    except Exception as exc:  # a backend that raises becomes a row; the sweep goes on
        status, reason = failure_status(exc)
        free(device)
        return both(status, reason)
    result = BackendResult([])
    out_c = backend.from_layout(out.detach())
    try:
        check = judge("out", out_c, prepared.reference.out, case.dtype, prepared.naive_error("out", backend.name))
    except ValueError as exc:  # wrong shape: the backend's answer cannot even be compared
        return both("fail", str(exc))
    result.checks["out"], result.out = check, out_c
    result.rows.append(verdict_row(prepared, backend, "fwd", "pass" if check.passed else "fail",
                                   "; ".join(filter(None, [None if check.passed else check.describe(), note])),
                                   [check], run_id))
    if bwd_reason:
        result.rows.append(verdict_row(prepared, backend, "bwd", "unsupported", bwd_reason, run_id=run_id))
        return result
    try:
        out.backward(d_out)
    except Exception as exc:
        status, reason = failure_status(exc)
        result.rows.append(verdict_row(prepared, backend, "bwd", status, reason, run_id=run_id))
        free(device)
        return result
    grad_checks = []
    for name, tensor in zip(GRADS, (q, k, v)):
        grad = backend.from_layout(tensor.grad) if tensor.grad is not None else torch.zeros_like(tensor)
        result.grads[name] = grad
        grad_checks.append(judge(name, grad, prepared.reference.get(name), case.dtype,
                                 prepared.naive_error(name, backend.name)))
        result.checks[name] = grad_checks[-1]
    failed = [c.describe() for c in grad_checks if not c.passed]
    result.rows.append(verdict_row(prepared, backend, "bwd", "fail" if failed else "pass",
                                   "; ".join(filter(None, failed + [note])), grad_checks, run_id))
    return result
