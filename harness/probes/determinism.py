"""Determinism: the same backward repeated on identical inputs, gradients compared bitwise.

Judged (pass/fail) only where the backend claims a deterministic backward; recorded (observed) for the rest,
since a kernel that accumulates dQ with atomics (FA2 without deterministic=True) is allowed to differ.
"""

from __future__ import annotations

import torch

from harness.backends.base import Backend
from harness.execution.call import Call
from harness.execution.executor import Executor, make_executor
from harness.probes.common import probe_dtype, probe_row, refused
from harness.spec.case import AttentionCase
from harness.spec.masks import Causal
from harness.store.schema import BWD, ERROR, FAIL, GRADS, OBSERVED, PASS, Row

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


def check_determinism(backend: Backend, device: torch.device, *, seed: int = 0, run_id: str = "",
                      executor: Executor | None = None) -> Row:
    """One 'determinism:<case id>' bwd row: pass/fail where claimed, observed otherwise."""
    executor = executor if executor is not None else make_executor()
    case = determinism_case(probe_dtype(backend, device), device)

    def row(status: str, observed: str = "", reason: str = "", op: str = "") -> Row:
        return probe_row(case, backend, device, tag="determinism", phase=BWD, status=status, observed=observed,
                         reason=reason, run_id=run_id, op=op)

    gate = refused(backend, case, device, executor, backward=True)
    if gate:
        return row(gate[0], "", gate[1])
    runs = []
    for _ in range(REPEATS):  # the same seeded inputs each time (a worker draws them once and keeps them)
        answer = executor.call(backend, Call(case, seed, backward=True), device)
        failure = answer.failure or answer.backward_failure
        if failure is not None:
            return row(ERROR, "", failure.reason)
        runs.append({"out": answer.out, **answer.grads})
    differ = []
    for name in ("out", *GRADS):
        worst = max(float((r[name].double() - runs[0][name].double()).abs().max()) for r in runs[1:])
        if any(not torch.equal(r[name], runs[0][name]) for r in runs[1:]):
            differ.append(f"{name} (max |diff| {worst:.3g})")
    observed = (f"bitwise equal over {REPEATS} runs" if not differ else "differs: " + ", ".join(differ))
    why = claim(backend)
    if why is None:
        return row(OBSERVED, observed, "no determinism claimed")
    return row(FAIL if differ else PASS, observed, "" if not differ else f"claimed deterministic ({why})",
               answer.backward_op)
