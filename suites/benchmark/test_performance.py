"""Latency, peak memory and FLOP/s of every (case, backend, phase) whose correctness passed; needs --benchmark.

Each key is timed in --rounds rounds spread over the run (round-major order); its row pools them all.
"""

from __future__ import annotations

import pytest
import torch

from harness.execution.benchmark import phase_callables

#: the pooled figures of a key that pytest-benchmark's JSON carries in extra_info
EXTRA_INFO = ("case_id", "backend", "phase", "latency_ms", "latency_iqr_ms", "latency_min_ms", "n_samples", "rounds",
              "round_spread", "timing_mode", "threads", "peak_mem_bytes", "mem_method", "tflops", "pct_of_peak",
              "suspicious", "compile_ms")


# Rounds before the last leave pytest-benchmark's fixture unused on purpose (it records the last round only);
# requesting it in every round keeps --benchmark-only / --benchmark-skip working on these items.
@pytest.mark.filterwarnings("ignore:Benchmark fixture was not used at all")
def test_performance(case, backend, phase, perf_round, run_session, benchmark, request):
    if not request.config.getoption("benchmark_enabled"):
        pytest.skip("performance tests run only with --benchmark")
    result = run_session.benchmark_round(case, backend, phase, perf_round)
    if result is None:  # the reason is in that round's skip and row; repeating it would multiply the skip summary
        pytest.skip("not timed after an earlier round")
    if result.measurement is None:
        pytest.skip(f"{result.row.status}: {result.row.reason}")
    if perf_round < run_session.rounds - 1:
        return
    # Last round: pytest-benchmark's own table, JSON and --benchmark-compare get one entry per key, carrying our
    # pooled numbers; its timing is a few synchronized calls of the same callable.
    benchmark.extra_info.update({k: getattr(result.row, k) for k in EXTRA_INFO})
    prepared = run_session.timing_inputs(case)
    setup, fn = phase_callables(backend, prepared, phase)
    device = prepared.device

    def synced():
        fn()
        if device.type == "cuda":  # pytest-benchmark uses the host clock: wait for the kernels it launched
            torch.cuda.synchronize(device)

    benchmark.pedantic(synced, setup=setup, rounds=2, iterations=1, warmup_rounds=0)
