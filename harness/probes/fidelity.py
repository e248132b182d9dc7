"""The timing fidelity probe, run where the backend runs: its forward timed by the harness's timer and by an
independent one (measure.fidelity); the suite records the figure as an observed row."""

from __future__ import annotations

import torch

from harness.backends.base import Backend
from harness.calls.bound import BoundCall, backend_inputs
from harness.calls.call import Call, call_inputs, device_scope
from harness.measure.fidelity import Fidelity, fidelity
from harness.measure.stages import stage


def fidelity_of(backend: Backend, device: torch.device, case, seed: int) -> Fidelity:
    """The forward of `backend` on `case` timed by the harness and an independent timer (measure.fidelity)."""
    call = BoundCall(backend, case, device)
    q, k, v, _ = backend_inputs(backend, case, call_inputs(Call(case, seed), device), requires_grad=False)
    with device_scope(device), torch.no_grad(), stage("fidelity"):
        return fidelity(lambda: call(q, k, v), device)
