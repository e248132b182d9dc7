"""Timing fidelity: the harness and an independent timer on the same kernel and shape; the ratio is a recorded figure."""

from __future__ import annotations

import pytest

from harness import AttentionCase
from harness.backends.base import get_backends
from harness.fidelity import fidelity
from harness.masks import Causal
from harness.runner import backend_inputs, case_columns


def test_timing_fidelity(request, run_session, benchmark):
    if not request.config.getoption("benchmark_enabled"):
        pytest.skip("timing fidelity runs only with --benchmark")
    device = run_session.device
    dtype = "bf16" if device.type == "cuda" else "fp32"
    seq = 4096 if device.type == "cuda" else 1024
    case = AttentionCase(2, 8, seq, 128 if device.type == "cuda" else 64, dtype, mask=Causal())
    backend = get_backends(["sdpa"])[0]
    q, k, v, _ = backend_inputs(backend, run_session.timing_inputs(case).inputs, requires_grad=False)

    def call():
        return backend.forward(q, k, v, mask=case.mask, scale=case.scale)

    result = fidelity(call, device)
    row = {"run_id": run_session.run_id, "backend": backend.name, "phase": "fwd",
           **case_columns(case, device) | {"case_id": f"fidelity:{case.id}"}, "status": "observed",
           "observed": f"harness/{result['independent']} = {result['ratio']:.3f}",
           "latency_ms": result["harness_ms"], "n_samples": result["n_samples"], "timing_mode": result["harness_mode"]}
    run_session.writer.write([row])
    run_session.env.setdefault("timing_fidelity", []).append({"case_id": case.id, **result})
    run_session.save_env()
    benchmark.extra_info.update(result)
    benchmark.pedantic(call, rounds=2, iterations=1)
