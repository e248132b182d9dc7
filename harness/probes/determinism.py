"""Determinism: the same backward repeated on identical inputs, gradients compared bitwise.

Judged (pass/fail) only where the backend claims a deterministic backward; recorded (observed) for the rest,
since a kernel that accumulates dQ with atomics (FA2 without deterministic=True) is allowed to differ.
"""

from __future__ import annotations

import torch

from harness.backends.base import Backend
from harness.execution.call import BoundCall, backend_inputs
from harness.execution.outcome import exception_text
from harness.probes.common import probe_dtype, probe_row, refused
from harness.spec.case import AttentionCase, make_inputs
from harness.spec.masks import Causal
from harness.store.schema import GRADS, Row

REPEATS = 3


def claim(backend: Backend) -> str | None:
    """Why `backend` is expected to be deterministic (its `deterministic` capability), or None when it makes no
    such claim."""
    if isinstance(backend.deterministic, str):
        return backend.deterministic
    return "declared by the backend" if backend.deterministic else None


def determinism_case(dtype: torch.dtype, device: torch.device) -> AttentionCase:
    """Causal, with keys spanning several kernel tiles so split or atomic accumulation would show: 1024 on a
    GPU (many thread blocks per head), 129 on CPU (off-tile, and a CPU run must stay short)."""
    return AttentionCase(2, 4, 1024 if device.type == "cuda" else 129, 64, dtype, mask=Causal())


def check_determinism(backend: Backend, device: torch.device, *, seed: int = 0, run_id: str = "") -> Row:
    """One 'determinism:<case id>' bwd row: pass/fail where claimed, observed otherwise."""
    case = determinism_case(probe_dtype(backend, device), device)

    def row(status: str, observed: str = "", reason: str = "") -> Row:
        return probe_row(case, backend, device, tag="determinism", phase="bwd", status=status, observed=observed,
                         reason=reason, run_id=run_id)

    gate = refused(backend, case, device, backward=True)
    if gate:
        return row(gate[0], "", gate[1])
    inputs = make_inputs(case, device, seed)
    runs = []
    try:
        call = BoundCall(backend, case, device)
        for _ in range(REPEATS):
            q, k, v, d_out = backend_inputs(backend, inputs, True)
            out = call(q, k, v)
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
