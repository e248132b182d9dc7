"""Runs one backend on one case: inputs and reference shared per case, verdict per phase, rows for the CSV."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from datetime import datetime, timezone

import torch

from harness.backends.base import Backend, Unsupported, all_backends
from harness.case import AttentionCase, Inputs, dtype_name, make_inputs
from harness.env import device_name, git_state, testbed_id
from harness.reference import Reference, reference_attention
from harness.verdict import NAIVE_BOUND, Check, judge

GRADS = ("dq", "dk", "dv")


@dataclass
class BackendResult:
    """What one backend produced on one case (canonical layout) and the rows describing it."""

    rows: list[dict]
    checks: dict[str, Check] = field(default_factory=dict)
    out: torch.Tensor | None = None
    grads: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def status(self) -> str:
        """Worst status over the phases: fail/error/oom beat pass; unsupported alone is unsupported."""
        order = ["error", "oom", "fail", "pass", "unsupported", "unavailable", "observed"]
        statuses = {r["status"] for r in self.rows}
        return next(s for s in order if s in statuses)

    @property
    def reasons(self) -> str:
        reasons = {r["reason"] for r in self.rows if r.get("reason")}
        if len(reasons) == 1 and len(self.rows) > 1 and all(r.get("reason") for r in self.rows):
            return reasons.pop()
        return "; ".join(f"{r['phase']}: {r['reason']}" for r in self.rows if r.get("reason"))


@dataclass
class PreparedCase:
    """Inputs (on the device), the float64 reference and the naive errors, computed once per case."""

    case: AttentionCase
    device: torch.device
    inputs: Inputs
    reference: Reference
    naive_errors: dict[str, float] | None
    naive_note: str = ""

    def naive_error(self, quantity: str, backend_name: str) -> float | None:
        """The baseline error a backend's tolerance is built from (verdict.judge): None for naive itself (held
        to its fixed bound); without a usable baseline, the naive bound at this quantity's magnitude."""
        if backend_name == "naive":
            return None
        if self.naive_errors is not None and quantity in self.naive_errors:
            return self.naive_errors[quantity]
        ref = dict(zip(("out", *GRADS), self.reference))[quantity]
        return NAIVE_BOUND[self.case.dtype] * max(1.0, float(ref.abs().max()))


def prepare_case(case: AttentionCase, device: torch.device, seed: int = 0, *, inputs: Inputs | None = None,
                 reference_inputs: Inputs | None = None) -> PreparedCase:
    """Inputs (seeded randn unless given), the float64 reference and the naive errors for `case`.

    `reference_inputs` (default: the inputs) feed the reference and the naive baseline, so values that must
    not matter (NaN in storage beyond the end) can be kept out of them.
    """
    inputs = make_inputs(case, device, seed) if inputs is None else inputs
    clean = inputs if reference_inputs is None else reference_inputs
    prepared = PreparedCase(case, device, clean, reference_attention(case, clean), None)
    result = execute(all_backends()["naive"], prepared)
    if result.status == "pass" and set(result.checks) == {"out", *GRADS}:
        prepared.naive_errors = {q: c.err for q, c in result.checks.items()}
    else:
        # Without a trustworthy same-precision baseline, fall back to the naive bound as its stand-in.
        prepared.naive_note = f"naive baseline unusable ({result.status}: {result.reasons}); tolerance uses NAIVE_BOUND"
    prepared.inputs = inputs
    return prepared


def case_columns(case: AttentionCase, device: torch.device) -> dict:
    return {"case_id": case.id, "batch": case.batch, "heads": case.heads, "kv_heads": case.kv_heads,
            "seq_q": case.seq_q, "seq_k": case.seq_k, "head_dim": case.head_dim, "dtype": dtype_name(case.dtype),
            "mask": case.mask_id, "scale": case.scale, "device": str(device)}


def _row(prepared: PreparedCase, backend: Backend, phase: str, status: str, reason: str = "",
         checks: list[Check] | None = None, run_id: str = "") -> dict:
    case, device = prepared.case, prepared.device
    row = {"run_id": run_id, "backend": backend.name, "phase": phase, **case_columns(case, device),
           "status": status, "reason": reason, "backend_op": backend.last_op() if status in ("pass", "fail") else "",
           "device_name": device_name(device), "testbed_id": testbed_id(device),
           "torch_version": torch.__version__, "backend_version": backend.version(), "git_sha": git_state()[0],
           "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    for check in checks or []:
        row[f"{check.quantity}_err"] = check.err
        row[f"{check.quantity}_tol"] = check.tol
        if check.naive_err is not None:
            row[f"naive_{check.quantity}_err"] = check.naive_err
    if checks:
        row["err_ratio"] = max(c.ratio for c in checks)
        row["nonfinite"] = any(c.nonfinite for c in checks)
    return row


def _failure_status(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, Unsupported):
        return "unsupported", str(exc)
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return "oom", f"out of memory: {str(exc).splitlines()[0][:300]}"
    return "error", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:400] if str(exc).strip() else ''}"


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def backend_inputs(backend: Backend, inputs: Inputs, requires_grad: bool) -> tuple[torch.Tensor, ...]:
    """Fresh copies of q, k, v, d_out in the backend's native layout (contiguous), outside any timing."""
    q, k, v, d_out = (backend.to_layout(t).detach().clone(memory_format=torch.contiguous_format) for t in inputs)
    return q.requires_grad_(requires_grad), k.requires_grad_(requires_grad), v.requires_grad_(requires_grad), d_out


def execute(backend: Backend, prepared: PreparedCase, run_id: str = "") -> BackendResult:
    """Run forward and backward of `backend` on the prepared case and judge both phases against the reference."""
    case, device = prepared.case, prepared.device

    def both(status: str, reason: str) -> BackendResult:
        return BackendResult([_row(prepared, backend, p, status, reason, run_id=run_id) for p in ("fwd", "bwd")])

    reason = backend.unavailable_reason(device)
    if reason:
        return both("unavailable", reason)
    reasons = backend.not_supported_reasons(case)
    if reasons:
        return both("unsupported", "; ".join(reasons))
    bwd_reason = backend.backward_unsupported_reason(device)
    def naive_for(quantity: str) -> float | None:
        return prepared.naive_error(quantity, backend.name)

    note = prepared.naive_note if backend.name != "naive" else ""

    q, k, v, d_out = backend_inputs(backend, prepared.inputs, requires_grad=bwd_reason is None)
    try:
        out = backend.forward(q, k, v, mask=case.mask, scale=case.scale)
    except Exception as exc:  # a backend that raises becomes a row; the sweep goes on
        status, reason = _failure_status(exc)
        _free(device)
        return both(status, reason)
    result = BackendResult([])
    out_c = backend.from_layout(out.detach())
    try:
        check = judge("out", out_c, prepared.reference.out, case.dtype, naive_for("out"))
    except ValueError as exc:  # wrong shape: the backend's answer cannot even be compared
        return both("fail", str(exc))
    result.checks["out"], result.out = check, out_c
    result.rows.append(_row(prepared, backend, "fwd", "pass" if check.passed else "fail",
                            "; ".join(filter(None, [None if check.passed else check.describe(), note])),
                            [check], run_id))
    if bwd_reason:
        result.rows.append(_row(prepared, backend, "bwd", "unsupported", bwd_reason, run_id=run_id))
        return result
    try:
        out.backward(d_out)
    except Exception as exc:
        status, reason = _failure_status(exc)
        result.rows.append(_row(prepared, backend, "bwd", status, reason, run_id=run_id))
        _free(device)
        return result
    grad_checks = []
    for name, tensor, ref in zip(GRADS, (q, k, v), prepared.reference[1:]):
        grad = backend.from_layout(tensor.grad) if tensor.grad is not None else torch.zeros_like(tensor)
        result.grads[name] = grad
        grad_checks.append(judge(name, grad, ref, case.dtype, naive_for(name)))
        result.checks[name] = grad_checks[-1]
    failed = [c.describe() for c in grad_checks if not c.passed]
    result.rows.append(_row(prepared, backend, "bwd", "fail" if failed else "pass",
                            "; ".join(filter(None, failed + [note])), grad_checks, run_id))
    return result
