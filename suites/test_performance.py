"""Latency, peak memory and FLOP/s of every (case, backend, phase) whose correctness passed; needs --benchmark."""

from __future__ import annotations

import pytest

import torch

from harness.perf import measure_phase, phase_callables


def test_performance(case, backend, phase, run_session, benchmark, request):
    if not request.config.getoption("benchmark_enabled"):
        pytest.skip("performance tests run only with --benchmark")
    prepared = run_session.prepared(case)
    verdict = run_session.verdict(case, backend)
    result = measure_phase(backend, prepared, phase, verdict, config=run_session.timing, peaks=run_session.peaks,
                           run_id=run_session.run_id, cpu_mem_budget=run_session.cpu_mem_budget)
    run_session.record_perf(result)
    m = result.measurement
    if m is None:
        pytest.skip(f"{result.row['status']}: {result.row.get('reason', '')}")
    benchmark.extra_info.update({k: v for k, v in result.row.items() if k in (
        "case_id", "backend", "phase", "latency_ms", "latency_iqr_ms", "latency_min_ms", "n_samples", "timing_mode",
        "threads", "peak_mem_bytes", "mem_method", "tflops", "pct_of_peak", "suspicious", "compile_ms")})
    # pytest-benchmark's own table, JSON and --benchmark-compare: a few synchronized rounds of the same call.
    setup, fn = phase_callables(backend, prepared, phase)
    device = prepared.device

    def synced():
        fn()
        if device.type == "cuda":  # pytest-benchmark uses the host clock: wait for the kernels it launched
            torch.cuda.synchronize(device)

    benchmark.pedantic(synced, setup=setup, rounds=2, iterations=1, warmup_rounds=0)
