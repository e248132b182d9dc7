"""Latency, peak memory and FLOP/s of every (case, backend, phase) whose correctness passed; needs --benchmark.

Each key is timed in --rounds rounds spread over the run (round-major order); its row pools them all.
"""

from __future__ import annotations

import pytest
import torch

from harness.perf import measure_phase, phase_callables


# Rounds before the last leave pytest-benchmark's fixture unused on purpose (it records the last round only);
# requesting it in every round keeps --benchmark-only / --benchmark-skip working on these items.
@pytest.mark.filterwarnings("ignore:Benchmark fixture was not used at all")
def test_performance(case, backend, phase, perf_round, run_session, benchmark, request):
    if not request.config.getoption("benchmark_enabled"):
        pytest.skip("performance tests run only with --benchmark")
    key = (case.id, backend.name, phase)
    before = run_session.perf_rows.get(key)  # None: no earlier round of this key ran (e.g. this item run alone)
    if before is not None and before["status"] != "pass":
        # the reason is in that round's skip and row; repeating it would multiply the skip summary
        pytest.skip(f"not timed after an earlier round ({before['status']})")
    verdict = run_session.verdict(case, backend)
    prepared = run_session.timing_inputs(case)
    result = measure_phase(backend, prepared, phase, verdict, config=run_session.round_timing,
                           peaks=run_session.peaks, run_id=run_session.run_id,
                           cpu_mem_budget=run_session.cpu_mem_budget,
                           prior_rounds=run_session.round_samples.get(key, []),
                           known_memory=run_session.round_memory.get(key))
    if result.measurement is None and before is not None:
        result.row["reason"] = (f"round {perf_round + 1} of {run_session.rounds}: {result.row.get('reason', '')}; "
                                "the latency columns pool the rounds timed before it")
    run_session.record_perf(result, round_index=perf_round)
    if result.measurement is None:
        pytest.skip(f"{result.row['status']}: {result.row.get('reason', '')}")
    if perf_round < run_session.rounds - 1:
        return
    # Last round: pytest-benchmark's own table, JSON and --benchmark-compare get one entry per key, carrying our
    # pooled numbers; its timing is a few synchronized calls of the same callable.
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
