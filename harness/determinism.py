"""Determinism: the same backward repeated on identical inputs, gradients compared bitwise.

Judged (pass/fail) only where the backend claims a deterministic backward; recorded (observed) for the rest,
since a kernel that accumulates dQ with atomics (FA2 without deterministic=True) is allowed to differ.
"""

from __future__ import annotations

import torch

from harness.backends.base import Backend
from harness.case import AttentionCase, make_inputs
from harness.masks import Causal
from harness.probe import exception_text, probe_dtype, probe_row
from harness.runner import GRADS, backend_inputs

REPEATS = 3

#: claims from the libraries' documentation, for backends that do not declare `deterministic` themselves
#: (a backend's own `deterministic` attribute, when set, wins)
DOCUMENTED_CLAIMS: dict[str, str] = {
    "naive": "eager matmul/softmax with a fixed reduction order",
    "sdpa-math": "PyTorch: the math backend's backward is deterministic (composite of deterministic ops)",
}


def claim(backend: Backend) -> str | None:
    """Why `backend` is expected to be deterministic, or None when it makes no such claim."""
    if backend.deterministic is not None:
        return "declared by the backend" if backend.deterministic else None
    return DOCUMENTED_CLAIMS.get(backend.name)


def determinism_case(dtype: torch.dtype, device: torch.device) -> AttentionCase:
    """Causal, with keys spanning several kernel tiles so split or atomic accumulation would show: 1024 on a
    GPU (many thread blocks per head), 129 on CPU (off-tile, and a CPU run must stay short)."""
    return AttentionCase(2, 4, 1024 if device.type == "cuda" else 129, 64, dtype, mask=Causal())


def check_determinism(backend: Backend, device: torch.device, *, seed: int = 0, run_id: str = "") -> dict:
    """One 'determinism:<case id>' bwd row: pass/fail where claimed, observed otherwise."""
    case = determinism_case(probe_dtype(backend, device), device)

    def row(status: str, observed: str = "", reason: str = "") -> dict:
        return probe_row(case, backend, device, tag="determinism", phase="bwd", status=status, observed=observed,
                         reason=reason, run_id=run_id)

    reason = backend.unavailable_reason(device)
    if reason:
        return row("unavailable", "", reason)
    reasons = backend.not_supported_reasons(case)
    bwd = backend.backward_unsupported_reason(device)
    if reasons or bwd:
        return row("unsupported", "", "; ".join(reasons + ([bwd] if bwd else [])))
    inputs = make_inputs(case, device, seed)
    runs = []
    try:
        for _ in range(REPEATS):
            q, k, v, d_out = backend_inputs(backend, inputs, True)
            out = backend.forward(q, k, v, mask=case.mask, scale=case.scale)
            out.backward(d_out)
            runs.append({"out": out.detach(), **{n: t.grad for n, t in zip(GRADS, (q, k, v))}})
    except Exception as exc:
        return row("error", "", exception_text(exc))
    differ = []
    for name in ("out", *GRADS):
        worst = max(float((r[name].double() - runs[0][name].double()).abs().max()) for r in runs[1:])
        if any(not torch.equal(r[name], runs[0][name]) for r in runs[1:]):
            differ.append(f"{name} (max |diff| {worst:.3g})")
    observed = (f"bitwise equal over {REPEATS} runs" if not differ else "differs: " + ", ".join(differ))
    why = claim(backend)
    if why is None:
        return row("observed", observed, "no determinism claimed")
    return row("fail" if differ else "pass", observed, "" if not differ else f"claimed deterministic ({why})")
