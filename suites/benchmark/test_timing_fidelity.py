"""Timing fidelity: the harness and an independent timer on the same kernel and shape; the ratio is a recorded figure."""

from __future__ import annotations

import pytest

from harness import AttentionCase
from harness.backends.registry import get_backends
from harness.execution.call import BoundCall, backend_inputs
from harness.measure.fidelity import fidelity
from harness.spec.masks import Causal
from harness.store.rows import make_row


def test_timing_fidelity(request, run_session, benchmark):
    if not request.config.getoption("benchmark_enabled"):
        pytest.skip("timing fidelity runs only with --benchmark")
    device = run_session.device
    dtype = "bf16" if device.type == "cuda" else "fp32"
    seq = 4096 if device.type == "cuda" else 1024
    case = AttentionCase(2, 8, seq, 128 if device.type == "cuda" else 64, dtype, mask=Causal())
    backend = get_backends(["sdpa"])[0]
    q, k, v, _ = backend_inputs(backend, run_session.timing_inputs(case).inputs, requires_grad=False)
    bound = BoundCall(backend, case, device)

    def call():
        return bound(q, k, v)

    result = fidelity(call, device)
    run_session.writer.write([make_row(
        run_id=run_session.run_id, case=case, backend=backend.name, backend_version=backend.version(), phase="fwd",
        device=device, status="observed", tag="fidelity",
        observed=f"harness/{result['independent']} = {result['ratio']:.3f}", latency_ms=result["harness_ms"],
        n_samples=result["n_samples"], timing_mode=result["harness_mode"])])
    run_session.env.setdefault("timing_fidelity", []).append({"case_id": case.id, **result})
    run_session.save_env()
    benchmark.extra_info.update(result)
    benchmark.pedantic(call, rounds=2, iterations=1)
