"""The benchmark stage: timing gated by correctness, its rows, failure rows, and rounds pooled over a run (CPU)."""

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from harness import AttentionCase
from harness.backends.base import Backend
from harness.backends.registry import get_backends
from harness.run.benchmark import measure_phase
from harness.calls.device import resolve_device
from harness.run.runner import execute, prepare_case
from harness.run.rounds import Round, RoundSchedule
from harness.run.session import RunSession
from harness.measure.measurement import Measurement
from harness.measure.timing import TimingConfig
from harness.cases.masks import Causal
from harness.store.load import load_results, load_samples

CPU = resolve_device("cpu")
FAST = TimingConfig(warmup_ms=5, budget_ms=20, min_reps=5)


def _perf(backend_name, case, phase, **kw):
    backend = get_backends([backend_name])[0] if isinstance(backend_name, str) else backend_name
    prepared = prepare_case(case, CPU)
    verdict = execute(backend, prepared)
    return measure_phase(backend, prepared, phase, verdict, config=FAST, peaks={"fp32": 0.1}, **kw)


@pytest.mark.parametrize("phase", ["fwd", "bwd", "fwd+bwd"])
def test_perf_row_has_every_measured_column(phase):
    res = _perf("sdpa-flash", AttentionCase(1, 2, 64, 32, "fp32", mask=Causal()), phase)
    row = res.row
    assert row.timing_status == "timed" and res.measurement is not None
    # fwd and bwd rows fold into the verdict rows: they leave the correctness status alone; fwd+bwd carries it
    assert row.status == ("pass" if phase == "fwd+bwd" else None)
    for col in ("latency_ms", "latency_iqr_ms", "latency_min_ms", "n_samples", "peak_mem_bytes", "flops", "tflops",
                "pct_of_peak"):
        value = getattr(row, col)
        assert value == value and value is not None, col  # present and not NaN
    assert row.latency_ms == pytest.approx(res.measurement.median)
    assert row.mem_method == "cpu-profiler-peak" and row.timing_mode == "cpu-clock"
    assert row.threads == torch.get_num_threads()


def test_failed_backend_is_not_timed(broken):
    res = _perf("broken-scale", AttentionCase(1, 2, 16, 32, "fp32"), "fwd")
    assert res.measurement is None and res.row.timing_status == "not-timed" and res.row.status is None
    assert res.row.timing_reason.startswith("not timed: fwd is fail:")


def test_oom_during_timing_is_a_row():
    class Hungry(Backend):
        name = "hungry"
        calls = 0

        def forward(self, q, k, v, *, mask, scale):
            Hungry.calls += 1
            if Hungry.calls > 2:  # passes correctness (its no-grad and grad calls), then runs out of memory timed
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)

    res = _perf(Hungry(), AttentionCase(1, 2, 16, 32, "fp32"), "fwd")
    assert res.row.timing_status == "oom" and "20.00 GiB" in res.row.timing_reason
    assert res.row.status is None  # the verdict row's pass stands: a timing failure never rewrites it


def test_cpu_memory_budget_records_oom():
    res = _perf("naive", AttentionCase(1, 2, 256, 32, "fp32"), "fwd", cpu_mem_budget=1024)
    assert res.row.timing_status == "oom" and "> CPU budget 1024" in res.row.timing_reason
    assert res.measurement is None


def test_memory_growth_separates_materialized_from_fused():
    """naive materializes (S x S) scores: ~4x memory per doubling; the fused CPU flash kernel at most ~2x
    (its O(S) output plus fixed per-thread blocks, so measured 1.5-2.4x)."""
    growth = {}
    for name in ("naive", "sdpa-flash"):
        peaks = [_perf(name, AttentionCase(1, 4, s, 64, "fp32"), "fwd").row.peak_mem_bytes for s in (1024, 2048)]
        growth[name] = peaks[1] / peaks[0]
    assert 3.3 < growth["naive"] < 4.5, growth
    assert 1.3 < growth["sdpa-flash"] < 2.5, growth
    assert growth["naive"] > 1.5 * growth["sdpa-flash"]


def test_later_rounds_pool_samples_and_reuse_memory():
    case = AttentionCase(1, 2, 64, 32, "fp32", mask=Causal())
    first = _perf("sdpa-flash", case, "fwd")
    second = _perf("sdpa-flash", case, "fwd", timing_round=Round(1, 2, first.measurement,
                                                                 memory=(12345, "from round 1")))
    row = second.row
    assert row.rounds == 2 and row.n_samples == first.measurement.n + second.measurement.n
    assert (row.peak_mem_bytes, row.mem_method) == (12345, "from round 1")
    pooled = sorted(first.measurement.samples_ms + second.measurement.samples_ms)
    assert row.latency_ms == pytest.approx(float(np.median(pooled)))


def test_round_timing_splits_the_budget(tmp_path):
    session = RunSession(CPU, tmp_path, timing=TimingConfig(warmup_ms=20, budget_ms=90, min_reps=10, max_reps=500),
                         rounds=3)
    t = TimingConfig(**json.loads((session.run_dir / "env.json").read_text())["round_timing"])
    assert (t.warmup_ms, t.budget_ms, t.min_reps, t.max_reps) == (pytest.approx(20 / 3), 30, 4, 167)
    # a slow key's min_reps are split over the rounds (4, 3, 3), so the rounds together take min_reps, not 12
    assert [session.schedule.timing_of(i).min_reps for i in range(3)] == [4, 3, 3]
    assert session.schedule.timing_of(0) == t
    assert json.loads((session.run_dir / "env.json").read_text())["rounds"] == 3
    assert RoundSchedule(session.schedule.timing, 1).timing_of(0) == session.schedule.timing
    with pytest.raises(ValueError, match="rounds=0"):
        RunSession(CPU, tmp_path, rounds=0)


def _suite_performance_test():
    """suites/benchmark/test_performance.py's test function, to drive its round logic directly."""
    path = Path(__file__).resolve().parents[3] / "suites" / "benchmark" / "test_performance.py"
    spec = importlib.util.spec_from_file_location("suite_test_performance", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.test_performance


class _FakeBenchmark:
    """pytest-benchmark's fixture as record_samples uses it (its stats keep what they were given, in seconds)."""

    def __init__(self):
        self.extra_info, self.calls, self._mode, self.disabled, self.group = {}, 0, None, False, None
        self.samples_s = []

    def _make_stats(self, iterations):
        self.calls += 1
        return SimpleNamespace(options={}, update=self.samples_s.append)


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
        except pytest.fail.Exception as exc:
            outcomes.append(f"failed: {exc}")
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
    assert row.status == "pass" and row.timing_status == "timed" and row.rounds == 3
    assert row.n_samples == len(samples)
    assert sorted(samples["round"].unique()) == [0, 1, 2]
    assert row.latency_ms == pytest.approx(float(np.median(samples.latency_ms)))
    assert bench.extra_info["rounds"] == 3
    # pytest-benchmark's statistics are of the same samples, every round's, in seconds
    assert sorted(bench.samples_s) == pytest.approx(sorted(samples.latency_ms / 1e3))
    assert bench.group == "fwd fp32-b1-h2-s32-d16-none"


def test_a_failure_in_a_later_round_ends_the_key_with_its_reason(tmp_path):
    session, outcomes, _ = _run_rounds(tmp_path, _Toggle(), fail_in_round=1)
    assert outcomes[0] == "passed" and outcomes[1].startswith("failed: error: round 2 of 3: during timing")
    assert outcomes[2] == "skipped: not timed after an earlier round"
    row = load_results(session.run_dir).set_index("phase").loc["fwd"]
    assert row.status == "pass"  # correctness stands; timing says what happened
    assert row.timing_status == "error" and row.timing_reason.startswith("round 2 of 3: during timing: RuntimeError")
    assert row.rounds == 1 and set(load_samples(session.run_dir)["round"]) == {0}  # round 1 kept, labelled


def test_a_later_round_run_alone_is_timed(tmp_path):
    """Running one item by its plain id (the last round) must measure, not skip for want of round 1."""
    test = _suite_performance_test()
    session = RunSession(CPU, tmp_path, timing=FAST, rounds=3)
    request = SimpleNamespace(config=SimpleNamespace(getoption=lambda name: True))
    bench = _FakeBenchmark()
    test(AttentionCase(1, 2, 32, 16, "fp32"), _Toggle(), "fwd", 2, session, bench, request)
    assert bench.calls == 1 and session.perf_rows[("fp32-b1-h2-s32-d16-none", "toggle", "fwd")].rounds == 1


def test_a_key_once_suspicious_stays_suspicious_with_its_reason():
    """Rows fold (later non-empty values win), so a later round could not clear the reason: the builder carries
    an earlier round's flag and reason onto the row it builds (peaks large enough that this round is not)."""
    case = AttentionCase(1, 2, 32, 16, "fp32")
    earlier = Measurement((1.0,), "cpu-clock", 1)
    res = _perf("sdpa-math", case, "fwd", timing_round=Round(1, 2, earlier, "suspicious: 9 TFLOP/s"))
    assert res.row.timing_status == "timed" and res.row.suspicious
    assert res.row.timing_reason == "suspicious: 9 TFLOP/s"
    plain = _perf("sdpa-math", case, "fwd", timing_round=Round(1, 2, earlier))
    assert plain.row.timing_status == "timed" and not plain.row.suspicious and plain.row.timing_reason == ""


def test_a_round_that_ends_its_key_says_which_round_as_built():
    """A later round's failure row names its round; a first round's, or a round run alone, does not."""
    backend, prepared = _Toggle(), prepare_case(AttentionCase(1, 2, 32, 16, "fp32"), CPU)
    verdict = execute(backend, prepared)
    backend.fail = True  # correct, then failing while timed

    def timed(timing_round):
        return measure_phase(backend, prepared, "fwd", verdict, config=FAST, peaks={}, timing_round=timing_round)

    later = timed(Round(1, 3, Measurement((1.0,), "cpu-clock", 1)))
    assert later.row.timing_status == "error" and later.measurement is None
    assert later.row.timing_reason.startswith("round 2 of 3: during timing: RuntimeError")
    assert later.row.timing_reason.endswith("; the latency columns pool the rounds timed before it")
    alone = timed(Round(2, 3))
    assert alone.row.timing_reason.startswith("during timing: RuntimeError")


def test_a_round_outside_its_count_is_refused():
    with pytest.raises(ValueError, match="round index=3 of count=3"):
        Round(3, 3)


def test_the_first_timed_call_is_the_cpu_memory_probe(monkeypatch):
    """On the CPU round 1 measures peak memory on its first call (kept apart from the samples), not a call of its
    own: one round built, measure told the first call was made (so it builds nothing again), and the row still has
    the profiler's peak."""
    import harness.calls.timed as timed

    phases, told = [], []
    monkeypatch.setattr(timed, "TimedRound", lambda *a, _real=timed.TimedRound: phases.append(1) or _real(*a))
    monkeypatch.setattr(timed, "measure", lambda *a, _real=timed.measure, **kw: told.append(kw) or _real(*a, **kw))
    res = _perf("naive", AttentionCase(1, 2, 256, 32, "bf16"), "bwd")
    assert res.row.mem_method == "cpu-profiler-peak" and res.row.peak_mem_bytes >= 2 * 256 * 256 * 2  # the scores
    assert phases == [1]  # one round: its first call was the probe
    assert [kw["warm"] for kw in told] == [True]


def test_the_fwd_phase_is_timed_without_autograd():
    """As the correctness call runs a forward-only phase: a compiled backend guarded on grad mode (flex) would
    otherwise compile again for timing (seen: 1.2 s per case on 2 cores, torch 2.13)."""
    modes = []

    class Recording(Backend):
        name = "recording"

        def forward(self, q, k, v, *, mask, scale):
            modes.append(torch.is_grad_enabled())
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)

    _perf(Recording(), AttentionCase(1, 2, 16, 32, "fp32"), "fwd")
    timing_calls = modes[2:]  # after the correctness calls (without autograd, then with it and its backward)
    assert modes[:2] == [False, True]
    assert timing_calls and not any(timing_calls)
