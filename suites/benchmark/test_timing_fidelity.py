"""Timing fidelity: the harness and an independent timer on the same kernel and shape, interleaved in blocks;
the ratio, its spread and whether the machine was too noisy to tell are recorded (a figure, not a verdict)."""

from __future__ import annotations

import pytest

from harness import AttentionCase
from harness.backends.registry import get_backends
from harness.probes.fidelity import fidelity_of
from harness.measure.fidelity import FIDELITY_TAG
from harness.cases.masks import Causal
from harness.store.rows import make_row
from harness.suite.benchmark_fixture import record_samples
from harness.store.schema import FWD, OBSERVED


def test_timing_fidelity(request, run_session, benchmark):
    if not request.config.getoption("benchmark_enabled"):
        pytest.skip("timing fidelity runs only with --benchmark")
    device = run_session.device
    dtype = "bf16" if device.type == "cuda" else "fp32"
    # a few ms a call on either device: long enough for a timer's overhead not to matter, short enough for many
    # interleaved calls
    case = (AttentionCase(2, 8, 4096, 128, dtype, mask=Causal()) if device.type == "cuda"
            else AttentionCase(1, 8, 512, 64, dtype, mask=Causal()))
    backend = get_backends(["sdpa"])[0]
    result = run_session.executor.run(backend, fidelity_of, device, case, run_session.seed)
    run_session.writer.write([make_row(
        run_id=run_session.run_id, case=case, backend=backend.name, backend_version=backend.version(), phase=FWD,
        device=device, status=OBSERVED, tag=FIDELITY_TAG, observed=result.describe(),
        **result.harness.latency_columns())])
    run_session.env.setdefault("timing_fidelity", []).append({"case_id": case.id, **result.columns()})
    run_session.save_env()
    record_samples(benchmark, result.harness.samples_ms, group=f"fidelity {case.id}", extra_info=result.columns())
