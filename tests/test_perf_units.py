"""Timing, memory and FLOP building blocks, and the perf stage's gating and failure rows (CPU)."""

import importlib.util
import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from harness import AttentionCase
from harness.backends.base import Backend
from harness.env import resolve_device
from harness.flops import attention_flops, matmul_peak_tflops
from harness.masks import Causal, CausalBottomRight, KeyPadding
from harness.memory import peak_memory
from harness.perf import measure_phase, pooled_latency
from harness.runner import execute, prepare_case
from harness.backends.base import get_backends
from harness.results import load_results, load_samples
from harness.session import RunSession
from harness.timing import Measurement, TimingConfig, measure

CPU = resolve_device("cpu")
FAST = TimingConfig(warmup_ms=5, budget_ms=20, min_reps=5)


def test_measurement_statistics():
    m = Measurement((1.0, 2.0, 3.0, 4.0, 100.0), "cpu-clock", 2)
    assert (m.n, m.median, m.min) == (5, 3.0, 1.0)
    assert m.iqr == pytest.approx(2.0) and m.noisy
    assert not Measurement((1.0, 1.01, 1.02, 0.99), "cpu-clock", 2).noisy


def test_setup_runs_outside_the_timed_region():
    m = measure(lambda: None, device=CPU, setup=lambda: time.sleep(0.005), config=FAST)
    assert m.median < 1.0 and m.n >= FAST.min_reps and len(m.samples_ms) == m.n


def test_repetitions_follow_the_budget():
    m = measure(lambda: time.sleep(0.002), device=CPU, config=TimingConfig(warmup_ms=0, budget_ms=40, min_reps=3))
    assert 3 <= m.n <= 20  # ~40 ms / ~2 ms, never fewer than min_reps


def test_bad_timing_config():
    with pytest.raises(ValueError, match="budgets must be > 0"):
        TimingConfig(budget_ms=0)


def test_cpu_peak_memory_counts_temporaries_not_inputs():
    existing = torch.ones(8 * 2 ** 20, dtype=torch.uint8)

    def work():
        tmp = torch.ones(32 * 2 ** 20, dtype=torch.uint8)  # 32 MiB, freed before returning
        return int(tmp[0]) + int(existing[0])

    peak, method = peak_memory(work, device=CPU)
    assert method == "cpu-profiler-peak"
    assert 32 * 2 ** 20 <= peak < 40 * 2 ** 20
    assert peak_memory(lambda: existing[:16].clone(), device=CPU)[0] < 2 ** 20


@pytest.mark.parametrize("mask, pairs", [
    (None, 2 * 10 * 12),
    (Causal(), 2 * sum(min(i + 1, 12) for i in range(10))),
    (CausalBottomRight(), 2 * sum(min(i + 3, 12) for i in range(10))),
    (KeyPadding((4, 12)), 10 * 4 + 10 * 12),
])
def test_flops_from_attended_pairs(mask, pairs):
    case = AttentionCase(2, 3, 10, 16, "fp32", kv_heads=1, seq_k=12, mask=mask)
    fwd = 4 * pairs * 3 * 16
    assert attention_flops(case, "fwd") == fwd
    assert attention_flops(case, "bwd") == int(2.5 * fwd)
    assert attention_flops(case, "fwd+bwd") == int(3.5 * fwd)
    with pytest.raises(ValueError, match="phase='both'"):
        attention_flops(case, "both")


def test_matmul_peak_is_measured():
    tflops, m = matmul_peak_tflops(CPU, torch.float32, config=FAST)
    assert tflops > 0 and m.n >= FAST.min_reps


def _perf(backend_name, case, phase, **kw):
    backend = get_backends([backend_name])[0] if isinstance(backend_name, str) else backend_name
    prepared = prepare_case(case, CPU)
    verdict = execute(backend, prepared)
    return measure_phase(backend, prepared, phase, verdict, config=FAST, peaks={"fp32": 0.1}, **kw)


@pytest.mark.parametrize("phase", ["fwd", "bwd", "fwd+bwd"])
def test_perf_row_has_every_measured_column(phase):
    res = _perf("sdpa-flash", AttentionCase(1, 2, 64, 32, "fp32", mask=Causal()), phase)
    row = res.row
    assert row["status"] == "pass" and res.measurement is not None
    for col in ("latency_ms", "latency_iqr_ms", "latency_min_ms", "n_samples", "peak_mem_bytes", "flops", "tflops",
                "pct_of_peak"):
        assert row[col] == row[col] and row[col] is not None, col  # present and not NaN
    assert row["latency_ms"] == pytest.approx(res.measurement.median)
    assert row["mem_method"] == "cpu-profiler-peak" and row["timing_mode"] == "cpu-clock"
    assert row["threads"] == torch.get_num_threads()


def test_failed_backend_is_not_timed(broken):
    res = _perf("broken-scale", AttentionCase(1, 2, 16, 32, "fp32"), "fwd")
    assert res.measurement is None and res.row["status"] == "fail" and "not timed" in res.row["reason"]


def test_oom_during_timing_is_a_row():
    class Hungry(Backend):
        name = "hungry"
        calls = 0

        def forward(self, q, k, v, *, mask, scale):
            Hungry.calls += 1
            if Hungry.calls > 1:  # passes correctness, then runs out of memory when timed
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)

    res = _perf(Hungry(), AttentionCase(1, 2, 16, 32, "fp32"), "fwd")
    assert res.row["status"] == "oom" and "20.00 GiB" in res.row["reason"]


def test_cpu_memory_budget_records_oom():
    res = _perf("naive", AttentionCase(1, 2, 256, 32, "fp32"), "fwd", cpu_mem_budget=1024)
    assert res.row["status"] == "oom" and "> CPU budget 1024" in res.row["reason"] and res.measurement is None


def test_memory_growth_separates_materialized_from_fused():
    """naive materializes (S x S) scores: ~4x memory per doubling; the fused CPU flash kernel at most ~2x
    (its O(S) output plus fixed per-thread blocks, so measured 1.5-2.4x)."""
    growth = {}
    for name in ("naive", "sdpa-flash"):
        peaks = [_perf(name, AttentionCase(1, 4, s, 64, "fp32"), "fwd").row["peak_mem_bytes"] for s in (1024, 2048)]
        growth[name] = peaks[1] / peaks[0]
    assert 3.3 < growth["naive"] < 4.5, growth
    assert 1.3 < growth["sdpa-flash"] < 2.5, growth
    assert growth["naive"] > 1.5 * growth["sdpa-flash"]


def test_pooled_latency_over_rounds():
    cols = pooled_latency([(1.0, 1.0, 1.1), (1.2, 1.2, 1.3)])
    assert cols["rounds"] == 2 and cols["n_samples"] == 6 and cols["latency_min_ms"] == 1.0
    assert cols["latency_ms"] == pytest.approx(1.15)  # median of all six samples
    assert cols["round_spread"] == pytest.approx((1.2 - 1.0) / 1.15)  # round medians 1.0 and 1.2
    assert cols["noisy"]  # rounds 17% apart, though each round alone is tight
    assert not pooled_latency([(1.0, 1.01), (1.0, 1.02)])["noisy"]


def test_later_rounds_pool_samples_and_reuse_memory():
    case = AttentionCase(1, 2, 64, 32, "fp32", mask=Causal())
    first = _perf("sdpa-flash", case, "fwd")
    second = _perf("sdpa-flash", case, "fwd", prior_rounds=[first.measurement.samples_ms],
                   known_memory=(12345, "from round 1"))
    row = second.row
    assert row["rounds"] == 2 and row["n_samples"] == first.measurement.n + second.measurement.n
    assert (row["peak_mem_bytes"], row["mem_method"]) == (12345, "from round 1")
    pooled = sorted(first.measurement.samples_ms + second.measurement.samples_ms)
    assert row["latency_ms"] == pytest.approx(float(np.median(pooled)))


def test_round_timing_splits_the_budget(tmp_path):
    session = RunSession(CPU, tmp_path, timing=TimingConfig(warmup_ms=20, budget_ms=90, min_reps=10, max_reps=500),
                         rounds=3)
    t = session.round_timing
    assert (t.warmup_ms, t.budget_ms, t.min_reps, t.max_reps) == (pytest.approx(20 / 3), 30, 4, 167)
    assert json.loads((session.run_dir / "env.json").read_text())["rounds"] == 3
    assert RunSession(CPU, tmp_path / "a", rounds=1).round_timing == RunSession(CPU, tmp_path / "b").timing
    with pytest.raises(ValueError, match="rounds=0"):
        RunSession(CPU, tmp_path, rounds=0)


def test_a_known_estimate_skips_the_first_call_and_the_estimate():
    calls = []
    cfg = TimingConfig(warmup_ms=0, budget_ms=1, min_reps=3, max_reps=3)
    m = measure(lambda: calls.append(1), device=CPU, config=cfg, estimate_ms=1.0)
    assert (m.n, len(calls)) == (3, 1 + 3)  # one warmup call, then the repetitions
    assert m.first_call_ms != m.first_call_ms  # nan: there was no first call to report
    calls.clear()
    assert measure(lambda: calls.append(1), device=CPU, config=cfg).n == 3 and len(calls) == 1 + 2 + 1 + 3


def _suite_performance_test():
    """suites/test_performance.py's test function, to drive its round logic directly."""
    path = Path(__file__).resolve().parent.parent / "suites" / "test_performance.py"
    spec = importlib.util.spec_from_file_location("suite_test_performance", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.test_performance


class _FakeBenchmark:
    def __init__(self):
        self.extra_info, self.calls = {}, 0

    def pedantic(self, fn, setup=None, rounds=1, iterations=1, warmup_rounds=0):
        self.calls += 1


def _run_rounds(tmp_path, backend, rounds=3, fail_in_round=None):
    """Drive the suite's test through every round of one key, as pytest would (round-major)."""
    test = _suite_performance_test()
    session = RunSession(CPU, tmp_path, timing=FAST, rounds=rounds)
    request = SimpleNamespace(config=SimpleNamespace(getoption=lambda name: True))
    case, outcomes, bench = AttentionCase(1, 2, 32, 16, "fp32"), [], _FakeBenchmark()
    for r in range(rounds):
        backend.fail = r == fail_in_round
        try:
            test(case, backend, "fwd", r, session, bench, request)
            outcomes.append("passed")
        except pytest.skip.Exception as exc:
            outcomes.append(f"skipped: {exc}")
    session.finish()
    return session, outcomes, bench


class _Toggle(Backend):
    """Correct SDPA that raises while `fail` is set: a failure in one measurement round only."""
    name = "toggle"
    fail = False

    def forward(self, q, k, v, *, mask, scale):
        if self.fail:
            raise RuntimeError("transient failure")
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)


def test_rounds_pool_into_one_row_and_label_their_samples(tmp_path):
    session, outcomes, bench = _run_rounds(tmp_path, _Toggle())
    assert outcomes == ["passed"] * 3 and bench.calls == 1  # pytest-benchmark: the last round only
    row = load_results(session.run_dir).set_index("phase").loc["fwd"]
    samples = load_samples(session.run_dir)
    assert row.status == "pass" and row.rounds == 3 and row.n_samples == len(samples)
    assert sorted(samples["round"].unique()) == [0, 1, 2]
    assert row.latency_ms == pytest.approx(float(np.median(samples.latency_ms)))
    assert bench.extra_info["rounds"] == 3


def test_a_failure_in_a_later_round_ends_the_key_with_its_reason(tmp_path):
    session, outcomes, _ = _run_rounds(tmp_path, _Toggle(), fail_in_round=1)
    assert outcomes[0] == "passed" and outcomes[1].startswith("skipped: error")
    assert outcomes[2] == "skipped: not timed after an earlier round (error)"
    row = load_results(session.run_dir).set_index("phase").loc["fwd"]
    assert row.status == "error" and row.reason.startswith("round 2 of 3: during timing: RuntimeError")
    assert row.rounds == 1 and set(load_samples(session.run_dir)["round"]) == {0}  # round 1 kept, labelled


def test_a_later_round_run_alone_is_timed(tmp_path):
    """Running one item by its plain id (the last round) must measure, not skip for want of round 1."""
    test = _suite_performance_test()
    session = RunSession(CPU, tmp_path, timing=FAST, rounds=3)
    request = SimpleNamespace(config=SimpleNamespace(getoption=lambda name: True))
    bench = _FakeBenchmark()
    test(AttentionCase(1, 2, 32, 16, "fp32"), _Toggle(), "fwd", 2, session, bench, request)
    assert bench.calls == 1 and session.perf_rows[("fp32-b1-h2-s32-d16-none", "toggle", "fwd")]["rounds"] == 1


def test_a_key_once_suspicious_stays_suspicious_with_its_reason(tmp_path):
    """Rows fold (later non-empty values win), so a later round could not clear the reason: keep both."""
    from harness.perf import PerfResult
    session = RunSession(CPU, tmp_path)
    base = {"case_id": "fp32-b1-h2-s32-d16-none", "backend": "x", "phase": "fwd", "status": "pass",
            "peak_mem_bytes": 1, "mem_method": "m"}
    session.record_perf(PerfResult({**base, "suspicious": True, "reason": "suspicious: 9 TFLOP/s"},
                                   Measurement((1.0,), "cpu-clock", 1)))
    session.record_perf(PerfResult({**base, "suspicious": False}, Measurement((2.0,), "cpu-clock", 1)), round_index=1)
    row = load_results(session.run_dir).iloc[0]
    assert bool(row.suspicious) and row.reason == "suspicious: 9 TFLOP/s"
