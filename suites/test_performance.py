"""Latency, peak memory and FLOP/s of every (case, backend, phase) whose correctness passed; needs --benchmark.

Each key is timed in --rounds rounds spread over the run (round-major order); its row pools them all.
"""

from __future__ import annotations

import pytest

import torch

from harness.perf import measure_phase, phase_callables


def test_performance(case, backend, phase, perf_round, run_session, request):
    if not request.config.getoption("benchmark_enabled"):
        pytest.skip("performance tests run only with --benchmark")
    key = (case.id, backend.name, phase)
    earlier = run_session.round_samples.get(key, [])
    if perf_round > 0 and not earlier:
        # the reason is on round 1's skip and in its row; repeating it would double the skip summary
        pytest.skip(f"not timed in round 1 ({run_session.perf_rows.get(key, {}).get('status', 'not run')})")
    verdict = run_session.verdict(case, backend)
    prepared = run_session.timing_inputs(case)
    known_memory = None
    if earlier:  # memory does not change between rounds: measured once, in the first
        first = run_session.perf_rows[key]
        known_memory = (first["peak_mem_bytes"], first["mem_method"])
    result = measure_phase(backend, prepared, phase, verdict, config=run_session.round_timing,
                           peaks=run_session.peaks, run_id=run_session.run_id,
                           cpu_mem_budget=run_session.cpu_mem_budget, prior_rounds=earlier, known_memory=known_memory)
    run_session.record_perf(result)
    if result.measurement is None:
        pytest.skip(f"{result.row['status']}: {result.row.get('reason', '')}")
    if perf_round < run_session.rounds - 1:
        return
    # Last round: pytest-benchmark's own table, JSON and --benchmark-compare get one entry per key, carrying our
    # pooled numbers; its timing is a few synchronized calls of the same callable.
    benchmark = request.getfixturevalue("benchmark")
    benchmark.extra_info.update({k: v for k, v in result.row.items() if k in (
        "case_id", "backend", "phase", "latency_ms", "latency_iqr_ms", "latency_min_ms", "n_samples", "rounds",
        "round_spread", "timing_mode", "threads", "peak_mem_bytes", "mem_method", "tflops", "pct_of_peak",
        "suspicious", "compile_ms")})
    setup, fn = phase_callables(backend, prepared, phase)
    device = prepared.device

    def synced():
        fn()
        if device.type == "cuda":  # pytest-benchmark uses the host clock: wait for the kernels it launched
            torch.cuda.synchronize(device)

    benchmark.pedantic(synced, setup=setup, rounds=2, iterations=1, warmup_rounds=0)
