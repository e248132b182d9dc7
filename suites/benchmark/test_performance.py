"""Latency, peak memory and FLOP/s of every (case, backend, phase) whose correctness passed; needs --benchmark.

Each key is timed in --rounds rounds spread over the run (round-major order); its row pools them all.
"""

from __future__ import annotations

import pytest

from harness.suite.benchmark_fixture import record_samples
from harness.store.schema import ERROR, REJECTED

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
    verdict = run_session.verdict(case, backend)  # the correctness stage's (run now if -k left its test out)
    result = run_session.benchmark_round(case, backend, phase, perf_round, verdict)
    if result is None:  # the reason is in that round's skip and row; repeating it would multiply the skip summary
        pytest.skip("not timed after an earlier round")
    if result.measurement is None:
        why = f"{result.row.timing_status}: {result.row.timing_reason}"
        # the backend passed correctness, then failed while timed, or its timed calls failed an integrity check
        if result.row.timing_status in (ERROR, REJECTED):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    if perf_round < run_session.rounds - 1:
        return
    # Last round: pytest-benchmark's table, JSON and --benchmark-compare get one entry per key whose statistics are
    # those of every sample of every round, the same the harness's row and `compare` use.
    record_samples(benchmark, result.pooled.samples_ms, group=f"{phase} {case.id}",
                   extra_info={k: getattr(result.row, k) for k in EXTRA_INFO})
