"""Timing, memory, FLOP and roofline building blocks (CPU)."""

import time

from dataclasses import replace

import pytest
import torch

from harness import AttentionCase
from harness.calls.device import resolve_device
from harness.measure.limits.flops import attention_flops
from harness.measure.measurement import Measurement
from harness.measure.memory import peak_memory
from harness.measure.limits.roofline import matmul_peak_tflops
from harness.measure.timing import Timed, TimingConfig, measure
from harness.cases.masks import Causal, CausalBottomRight, KeyPadding

CPU = resolve_device("cpu")
FAST = TimingConfig(warmup_ms=5, budget_ms=20, min_reps=5)


def test_measurement_statistics():
    m = Measurement((1.0, 2.0, 3.0, 4.0, 100.0), "cpu-clock", 2)
    assert (m.n, m.median, m.min) == (5, 3.0, 1.0)
    assert m.iqr == pytest.approx(2.0) and m.noisy
    assert not Measurement((1.0, 1.01, 1.02, 0.99), "cpu-clock", 2).noisy


def test_setup_runs_outside_the_timed_region():
    m = measure(Timed(lambda: None, setup=lambda: time.sleep(0.005)), device=CPU, config=FAST)
    assert m.median < 1.0 and m.n >= FAST.min_reps and len(m.samples_ms) == m.n


def test_repetitions_follow_the_budget():
    m = measure(lambda: time.sleep(0.002), device=CPU, config=TimingConfig(warmup_ms=0, budget_ms=40, min_reps=3))
    assert 3 <= m.n <= 20  # ~40 ms / ~2 ms, never fewer than min_reps


def test_a_first_call_made_by_the_caller_is_not_made_again_and_is_no_sample():
    """warm: the caller made the first call (the CPU memory probe's); measure starts at the estimate."""
    calls = []
    m = measure(lambda: calls.append("call"), device=CPU, config=TimingConfig(warmup_ms=0, budget_ms=5, min_reps=5),
                warm=True)
    # the first estimate call is no sample; the second, with no warm-up after it, is the first sample
    assert m.n == len(calls) - 1


def test_a_slow_call_is_estimated_once():
    """Above budget/min_reps every estimate gives min_reps repetitions, so a second estimate call is not made."""
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.03)  # 30 ms > 20 ms / 5

    m = measure(slow, device=CPU, config=FAST)
    assert m.n == FAST.min_reps
    # first; one estimate (the warm-up: 5 ms < that call), which is the first of the samples
    assert len(calls) == 1 + FAST.min_reps


def test_the_estimate_calls_count_as_warm_up(monkeypatch):
    """A fake clock (each call 1 ms): a 10 ms warm-up budget takes 10 calls, the two estimate calls among them;
    a call slower than the warm-up budget gets none beyond its estimate, which is then the first sample; a known
    estimate still gets one."""
    import harness.measure.timing as timing

    now, calls = [0], []

    def call():
        calls.append(1)
        now[0] += 1_000_000

    monkeypatch.setattr(timing, "CLOCKS", replace(timing.CLOCKS, now_ns=lambda: now[0]))
    measure(call, device=CPU, config=TimingConfig(warmup_ms=10, budget_ms=20, min_reps=5))
    assert len(calls) == 1 + 10 + 20  # first; 2 estimate + 8 warm-up calls; 20 repetitions of 1 ms
    calls.clear()
    measure(call, device=CPU, config=TimingConfig(warmup_ms=0.5, budget_ms=2, min_reps=5))
    assert len(calls) == 1 + 5  # first; one estimate (1 ms >= 2 ms / 5): the whole warm-up and the first sample
    calls.clear()
    measure(call, device=CPU, config=TimingConfig(warmup_ms=0.5, budget_ms=2, min_reps=5), estimate_ms=1.0)
    assert len(calls) == 1 + 5
    calls.clear()  # a later round of a call that warms itself (>= SELF_WARMING_MS): its repetitions only
    measure(call, device=CPU, config=TimingConfig(warmup_ms=0.5, budget_ms=2, min_reps=5),
            estimate_ms=timing.SELF_WARMING_MS)
    assert len(calls) == 5


def test_the_estimate_call_is_the_first_sample_only_when_no_warm_up_follows_it(monkeypatch):
    """A fake clock: the first call 50 ms, the next (the estimate) 7 ms, every later one 6 ms. With no warm-up
    call left the 7 ms estimate is the first of min_reps samples; with warm-up calls after it, it is no sample."""
    import harness.measure.timing as timing

    now, durations = [0], []

    def call():
        durations.append(50 if not durations else 7 if len(durations) == 1 else 6)
        now[0] += durations[-1] * 1_000_000

    monkeypatch.setattr(timing, "CLOCKS", replace(timing.CLOCKS, now_ns=lambda: now[0]))
    m = measure(call, device=CPU, config=TimingConfig(warmup_ms=5, budget_ms=20, min_reps=5))
    assert m.samples_ms == (7.0, 6.0, 6.0, 6.0, 6.0) and len(durations) == 1 + 5
    durations.clear()
    m = measure(call, device=CPU, config=TimingConfig(warmup_ms=20, budget_ms=20, min_reps=5))
    assert m.samples_ms == (6.0,) * 5 and len(durations) == 1 + 1 + 1 + 5  # first, estimate, 20 // 7 - 1 warm-up


def test_a_graph_is_captured_by_the_caller():
    with pytest.raises(ValueError, match=r"cuda_graph=True\) needs a captured call"):  # never eager calls under a graph's name
        measure(lambda: None, device=torch.device("cuda"), config=TimingConfig(cuda_graph=True))


def test_bad_timing_config():
    with pytest.raises(ValueError, match="budgets must be finite and > 0"):
        TimingConfig(budget_ms=0)
    with pytest.raises(ValueError, match="budgets must be finite"):
        TimingConfig(budget_ms=float("nan"))


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


def test_flops_count_the_value_head_dim_and_not_the_modifiers():
    mla = AttentionCase(1, 2, 8, 192, "bf16", head_dim_v=128, mask=Causal())
    pairs = 2 * sum(range(1, 9))
    assert attention_flops(mla, "fwd") == 2 * pairs * (192 + 128)
    capped = AttentionCase(1, 2, 8, 192, "bf16", head_dim_v=128, mask=Causal(), softcap=30.0, sinks=True, alibi=True)
    assert attention_flops(capped, "fwd") == attention_flops(mla, "fwd")


def test_matmul_peak_is_measured():
    tflops, m = matmul_peak_tflops(CPU, torch.float32, config=FAST)
    assert tflops > 0 and m.n >= FAST.min_reps


def test_merged_rounds_pool_their_samples():
    m = Measurement.merge([Measurement((1.0, 1.0, 1.1), "cpu-clock", 1), Measurement((1.2, 1.2, 1.3), "cpu-clock", 1)])
    cols = m.latency_columns()
    assert cols["rounds"] == 2 and cols["n_samples"] == 6 and cols["latency_min_ms"] == 1.0
    assert cols["latency_ms"] == pytest.approx(1.15)  # median of all six samples
    assert cols["round_spread"] == pytest.approx((1.2 - 1.0) / 1.15)  # round medians 1.0 and 1.2
    assert cols["noisy"]  # rounds 17% apart, though each round alone is tight
    assert not Measurement.merge([Measurement((1.0, 1.01), "cpu-clock", 1),
                                  Measurement((1.0, 1.02), "cpu-clock", 1)]).noisy
    again = Measurement.merge([m, Measurement((2.0,), "cpu-clock", 1)])  # a merged one keeps its rounds apart
    assert again.rounds == 3 and again.round_medians() == [1.0, 1.2, 2.0]


def test_a_known_estimate_skips_the_first_call_and_the_estimate():
    calls = []
    cfg = TimingConfig(warmup_ms=0, budget_ms=1, min_reps=3, max_reps=3)
    m = measure(lambda: calls.append(1), device=CPU, config=cfg, estimate_ms=1.0)
    assert (m.n, len(calls)) == (3, 1 + 3)  # one warmup call, then the repetitions
    calls.clear()
    # first, two estimates (with no warm-up after it, the second is the first sample), two more samples
    assert measure(lambda: calls.append(1), device=CPU, config=cfg).n == 3 and len(calls) == 1 + 2 + 2


@pytest.mark.parametrize("estimated", [False, True])
@pytest.mark.parametrize("call_ms", [0.05, 1.0, 7.0, 30.0, 150.0])
def test_the_cost_model_counts_the_calls_measure_makes(monkeypatch, call_ms, estimated):
    """planning.cost.planned_calls reads measure's own call plan (timing.call_plan): on a clock that advances by
    exactly call_ms a call (a fake bound in place of CLOCKS: no real time), measure makes as many calls as the cost
    model prices."""
    from harness.planning.cost import planned_calls
    from harness.measure import timing

    now = [0]
    monkeypatch.setattr(timing, "CLOCKS", replace(timing.CLOCKS, now_ns=lambda: now[0]))
    calls = []

    def call():
        calls.append(1)
        now[0] += int(call_ms * 1e6)

    cfg = TimingConfig().share(3, 1)
    measure(call, device=CPU, config=cfg, estimate_ms=call_ms if estimated else None)
    assert len(calls) == planned_calls(call_ms, cfg, device_type="cpu", estimated=estimated)
