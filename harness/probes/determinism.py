"""Determinism: the same backward repeated, compared bitwise; judged where claimed, else recorded (observed)."""

from __future__ import annotations

from functools import partial

import torch

from harness.backends.base import Backend
from harness.calls.call import Call
from harness.isolation.executor import Executor, make_executor
from harness.probes.common import probe_dtype, probe_row, refused
from harness.cases.case import AttentionCase
from harness.cases.masks import Causal
from harness.store.schema import BWD, ERROR, FAIL, GRADS, OBSERVED, PASS, Row

REPEATS = 3


def claim(backend: Backend) -> str | None:
    """Why `backend` is expected to be deterministic (its `deterministic` capability), or None."""
    if isinstance(backend.deterministic, str):
        return backend.deterministic
    return "declared by the backend" if backend.deterministic else None


def check_determinism(backend: Backend, device: torch.device, *, seed: int = 0, run_id: str = "",
                      executor: Executor | None = None) -> Row:
    """One 'determinism:<case id>' bwd row: pass/fail where claimed, observed otherwise."""
    executor = executor if executor is not None else make_executor()
    # causal over several kernel tiles (1024 keys on a GPU, 129 off-tile on CPU): split accumulation shows
    seq = 1024 if device.type == "cuda" else 129
    case = AttentionCase(2, 4, seq, 64, probe_dtype(backend, device), mask=Causal())
    row = partial(probe_row, case, backend, device, tag="determinism", phase=BWD, run_id=run_id)
    if gate := refused(backend, case, device, executor, backward=True):
        return row(status=gate[0], reason=gate[1])
    runs = []
    for _ in range(REPEATS):  # the same seeded inputs each time (a worker draws them once and keeps them)
        answer = executor.call(backend, Call(case, seed, backward=True), device)
        failure = answer.failure or answer.backward_failure
        if failure is not None:
            return row(status=ERROR, reason=failure.reason)
        runs.append({"out": answer.out, **answer.grads})
    first, rest = runs[0], runs[1:]
    differ = [f"{n} (max |diff| {max(float((r[n].double() - first[n].double()).abs().max()) for r in rest):.3g})"
              for n in ("out", *GRADS) if any(not torch.equal(r[n], first[n]) for r in rest)]
    observed = f"bitwise equal over {REPEATS} runs" if not differ else "differs: " + ", ".join(differ)
    why = claim(backend)
    if why is None:
        return row(status=OBSERVED, observed=observed, reason="no determinism claimed")
    return row(status=FAIL if differ else PASS, observed=observed,
               reason="" if not differ else f"claimed deterministic ({why})", op=answer.backward_op)
