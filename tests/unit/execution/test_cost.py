"""The cost of a matrix before it runs: FLOPs, memory, the reference's and baseline's time, and the refusal."""

from dataclasses import replace

import pytest
import torch

from harness.backends.naive import Naive
from harness.backends.registry import get_backends
from harness.planning.cost import LIMIT_S, OVERRIDE_FLAG, CaseCost, Job, check_cost, job_cost, matrix_cost, planned_calls
from harness.planning.rates import H200, RunRates, reference_rate
from harness.measure.timing import TimingConfig
from harness.oracle.reference import reference_flops
from harness.cases.case import AttentionCase
from harness.cases.masks import Causal
from harness.cases.presets import get_preset
from harness.store.schema import FWD, FWD_BWD

CPU = torch.device("cpu")
GIB = 2 ** 30
RATES = dict(rate=40e9, baseline_rates={torch.bfloat16: 1e9, torch.float32: 80e9}, memory=24 * GIB,
             reference_budget_bytes=256 * 2 ** 20, baseline_budget_bytes=4 * GIB)


def test_case_cost_counts_work_and_memory():
    case = AttentionCase(2, 8, 1024, 128, "bf16", kv_heads=2, mask=Causal())
    cost = CaseCost.of(case, reference_budget_bytes=256 * 2 ** 20, baseline_budget_bytes=GIB)
    assert cost.reference_flops == reference_flops(case) == 6 * 2 * 2 * 8 * 1024 * 1024 * 128
    q, kv = 2 * 8 * 1024 * 128, 2 * 2 * 1024 * 128
    assert cost.input_bytes == (2 * q + 2 * kv) * 2 * 2
    assert cost.reference_bytes >= (4 * q + 6 * kv) * 8                     # float64 copies, plus block buffers
    assert cost.peak_bytes == cost.input_bytes + max(cost.reference_bytes, cost.baseline_bytes)


def test_a_matrix_over_an_hour_is_refused_with_the_figures_and_the_flag():
    llama = get_preset("llama-3-8b").case(4, 8192)
    cost = matrix_cost([llama], CPU, **RATES)
    # 13.2 TFLOP at 40 GFLOP/s for the reference, at 1 GFLOP/s for the bf16 baseline
    assert cost.reference_seconds == pytest.approx(reference_flops(llama) / 40e9)
    assert cost.baseline_seconds == pytest.approx(reference_flops(llama) / 1e9)
    why = job_cost(cost, Job(())).refusal()
    assert "whole job would take ~3.8 h on cpu" in why and "reference and baseline ~3.8 h" in why
    assert OVERRIDE_FLAG in why
    assert llama.id in why and "Run it on a GPU" in why
    small = matrix_cost([AttentionCase(2, 4, 128, 64, "fp32")], CPU, **RATES)
    assert job_cost(small, Job(())).refusal() is None and "1 cases on cpu" in small.summary()


def test_a_case_that_does_not_fit_is_refused():
    decode = AttentionCase(16, 32, 1, 128, "bf16", kv_heads=8, seq_k=131072)
    why = job_cost(matrix_cost([decode], CPU, **{**RATES, "memory": 8 * GIB}), Job(())).refusal()
    assert f"{decode.id} needs ~" in why and "where cpu has 8.0 GiB" in why and OVERRIDE_FLAG in why
    assert "--seq and --batch with --preset/--hf-config" in why  # the options that size a model's cases


def test_check_cost_raises_unless_allowed(monkeypatch):
    import harness.planning.cost as cost_module

    monkeypatch.setattr(cost_module, "reference_rate", lambda device: 1e6)   # a very slow machine
    monkeypatch.setattr(cost_module, "baseline_rate", lambda device, dtype: 1e6)
    case = AttentionCase(1, 8, 2048, 128, "fp32")
    with pytest.raises(ValueError, match=OVERRIDE_FLAG):
        check_cost([case], CPU, Job(()), allow=False)
    assert check_cost([case], CPU, Job(()), allow=True).seconds > 3600


def test_the_reference_rate_is_measured_here():
    rate = reference_rate(CPU)
    assert 1e8 < rate < 1e13  # a measured float64 rate of this machine (FLOP/s), not a constant


def test_a_rate_skips_the_first_call_and_takes_the_best_of_samples_of_a_minimum_length(monkeypatch):
    """On a virtual clock (the machine's load moves no call): each call advances it by what it takes."""
    import harness.planning.rates as rates
    from harness.planning.cost import ASSUMED

    calls, now = [], [0.0]
    monkeypatch.setattr(rates.time, "perf_counter", lambda: now[0])

    def call():  # the first call pays a one-off cost (thread pool, kernel selection): 0.2 s against ~1 ms; the
        calls.append(1)  # first sample is slowed by other load (50 ms), which the best of the samples ignores
        now[0] += 0.2 if len(calls) == 1 else 0.05 if len(calls) == 3 else 0.001

    seconds = rates._best_seconds(call, CPU, repeats=3, min_sample_s=0.005)
    assert seconds == pytest.approx(0.001)  # neither the warm-up's 0.2 s nor the slowed sample (~25 ms a call)
    assert len(calls) == 1 + 2 + 2 * 5  # the slowed sample lasted 5 ms in 2 calls; each other looped 5 of 1 ms
    assert "best of" in ASSUMED and ASSUMED in job_cost(matrix_cost([AttentionCase(1, 2, 8, 8, "fp32")], CPU,
                                                                    **RATES), Job(())).summary()


def test_a_cpu_rate_is_one_threads_times_the_threads_and_leaves_the_thread_count_alone(monkeypatch):
    """Under load a multi-threaded GEMM stalls at its barriers (2 threads read 1 GFLOP/s bf16 where 1 thread read
    40-60, issue 35): the rate is measured on one thread and scaled; the run's thread count is restored."""
    import harness.planning.cost as cost
    import harness.planning.rates as rates

    seen = []
    monkeypatch.setattr(rates, "_best_seconds", lambda call, device, repeats, min_sample_s=0.0:
                        seen.append(torch.get_num_threads()) or 1.0)
    threads = torch.get_num_threads()
    b, n, d = rates.BASELINE_GEMM["cpu"]
    assert rates.baseline_rate.__wrapped__(CPU, torch.float32) == 2 * b * n * n * d * threads
    assert seen == [1] and torch.get_num_threads() == threads


def test_the_run_estimate_reproduces_the_h200_run_it_was_fitted_to():
    """The H200's gpu-smoke run (docs/measurements.md, 7 backends): correctness of its first 11 cases ended at
    ~247 s, and a benchmark round took ~120 s; the estimate of those cases with 3 rounds (~607 s seen) is within
    15 % above it (the slow dense backends' calls are counted by their declared relative speed)."""
    from harness.planning.fitted import run_estimate
    from harness.cases.matrices import build_matrix

    # gpu-smoke's cases then: those without paged KV or a model's modifiers, added since
    first = [c for c in build_matrix("gpu-smoke") if c.page_size is None and not c.modifiers
             and c.head_dim_v == c.head_dim]
    assert len(first) == 11
    seen = 247 + 3 * 120
    # the unit costs of that run (verdicts on the host): unit_costs.json's GPU entry extrapolates two of them since
    fitted = replace(H200, call_s=0.5, judged_per_s=6.6e7)
    assert seen <= run_estimate(first, rounds=3, rates=fitted) <= 1.15 * seen
    assert run_estimate(first, rounds=0, rates=fitted) == pytest.approx(247, rel=0.05)


def test_run_rates_are_for_their_device():
    with pytest.raises(ValueError, match="rates of a cuda device for a job on cpu"):
        job_cost(matrix_cost([AttentionCase(2, 4, 128, 64, "fp32")], CPU, **RATES), Job(()), H200)


#: unit costs in round numbers, so each step's seconds can be written out (no timing in these tests)
UNITS = RunRates("cpu", startup_s=10.0, session_s=6.0, case_s=1.0, call_s=0.5, call_floor_s=1e-4, judged_per_s=1e6,
                 key_round_s=0.2, compile_s=4.0, probes_s=3.0, probe_graphs=2, checks_s=5.0, fidelity_s=7.0)


def test_the_job_counts_each_backends_calls_compiles_and_timing_rounds_at_the_cases_size():
    case = AttentionCase(1, 2, 256, 32, "bf16", mask=Causal())
    matrix = matrix_cost([case], CPU, **RATES)
    naive, flex = get_backends(["naive", "flex"])
    timing = TimingConfig()
    cost = job_cost(matrix, Job((naive, flex), (FWD,), rounds=2, timing=timing, probes=True), UNITS)
    # bf16 at 1 GFLOP/s times each backend's declared relative speed on a CPU
    fwd, train = (reference_flops(case, grads=g) / 1e9 / naive.relative_speed["cpu"] for g in (False, True))
    out, grads = 2 * 256 * 32, 2 * 256 * 32 * 3
    # naive: the no-grad call and the training call, their answers judged (out twice, the gradients once)
    assert cost.seconds_of(case.id, "naive", stages=("correctness",)) == pytest.approx(
        0.5 + fwd + train + (2 * out + grads) / 1e6)
    # flex on a CPU: no backward, so the forward alone and one compile of the new shape
    flex_fwd = reference_flops(case, grads=False) / 1e9 / flex.relative_speed["cpu"]
    assert cost.seconds_of(case.id, "flex", stages=("correctness",)) == pytest.approx(0.5 + flex_fwd + 2 * out / 1e6)
    assert cost.seconds_of(case.id, "flex", stages=("compile",)) == 4.0
    # each round: the calls measure() plans at this latency, and the round's fixed cost
    for index in range(2):
        calls = planned_calls(fwd * 1e3, timing.share(2, index), device_type="cpu", estimated=index > 0)
        assert cost.seconds_of(case.id, "naive", FWD, index) == pytest.approx(0.2 + calls * fwd)
    assert cost.seconds_of("probes", "flex") == 3.0 + 2 * 4.0 and cost.seconds_of("probes", "naive") == 3.0
    assert cost.seconds_of("fidelity") == 7.0 and cost.seconds_of(stages=("start",)) == 10.0 + 6.0
    assert cost.seconds == pytest.approx(sum(cost.stage_seconds().values()))
    assert 1.0 + matrix.case_seconds(matrix.costs[0]) == cost.seconds_of(case.id, stages=("reference",))


def test_a_backends_declared_relative_speed_scales_its_calls_and_a_refused_case_costs_nothing():
    class Slow(Naive):
        relative_speed = {"cpu": Naive.relative_speed["cpu"] / 4}

    case = AttentionCase(1, 2, 512, 64, "fp32")
    matrix = matrix_cost([case], CPU, **RATES)
    plain, slow = (job_cost(matrix, Job((b,), (FWD_BWD,)), UNITS) for b in (Naive(), Slow()))
    # fp32 at 80 GFLOP/s times naive's relative speed
    calls = (reference_flops(case, grads=False) + reference_flops(case)) / 80e9 / Naive.relative_speed["cpu"]
    extra = (slow.seconds_of(case.id, stages=("correctness",)) - plain.seconds_of(case.id, stages=("correctness",)))
    assert extra == pytest.approx(3 * calls)  # four times as long

    class Bf16Only(Naive):
        dtypes = (torch.bfloat16,)

    assert job_cost(matrix, Job((Bf16Only(),), (FWD,)), UNITS).seconds_of(case.id, Bf16Only.name) == 0


def test_the_estimate_says_when_it_guesses_a_plugin_s_speed():
    """issue 67 item 5: a plugin's base run estimated at 131 s took 481 s - its speed was assumed, silently. A plugin
    declaring no relative_speed for the device is named as a guess; one that declares it, and the built-ins, are not."""
    class Mine(Naive):
        name, relative_speed = "my-attn", {}

    class Declared(Naive):
        name, relative_speed = "my-declared", {"cpu": 0.5}

    matrix = matrix_cost([AttentionCase(1, 2, 64, 32, "fp32")], CPU, **RATES)
    guessed = job_cost(matrix, Job((Naive(), Mine(), Declared()), (FWD,)), UNITS)
    assert guessed.guessed == ("my-attn",) and "A guess for my-attn: a plugin that declares no relative_speed for " \
        "cpu is assumed at the baseline's rate" in guessed.summary()
    assert "A guess" not in job_cost(matrix, Job((Naive(), Declared()), (FWD,)), UNITS).summary()


def test_the_refusal_takes_the_whole_job_not_only_the_reference():
    """issue 48: `recommend --preset llama-3-8b --seq 8192 --batch 4 --training` was estimated by its reference and
    baseline (~3 min), then ran well over an hour: the backends' calls and timing rounds decide it now."""
    case = get_preset("llama-3-8b").case(4, 8192)
    rates = dict(RATES, rate=1e12, baseline_rates={torch.bfloat16: 100e9})
    matrix = matrix_cost([case], CPU, **rates)
    assert matrix.seconds < 600  # the reference and baseline alone: minutes
    backends = tuple(get_backends(["naive", "sdpa", "sdpa-math"]))
    job = Job(backends, {case.id: (FWD_BWD,)}, timing=TimingConfig.for_budget(500.0, min_reps=15), advisor=True,
              checks=True)
    cost = job_cost(matrix, job, UNITS)
    assert cost.seconds > LIMIT_S and cost.stage_seconds()["timing"] > matrix.seconds
    why = cost.refusal()
    assert why.startswith("the whole job would take ~") and "timing rounds ~" in why and "correctness calls ~" in why
    assert "the longest step" in why and OVERRIDE_FLAG in why and "\n" not in why


def test_recommends_progress_weights_are_the_estimates_steps_so_its_first_line_agrees():
    from harness.advisor.progress import Progress
    from harness.advisor.recommend import step_weights, steps_per_workload
    from harness.advisor.workload import Workload

    workloads = [Workload(1, 4, 256, 64, dtype="fp32", training=True), Workload(2, 4, 128, 64, dtype="fp32")]
    backends = get_backends(["naive", "sdpa", "flex"])
    matrix = matrix_cost([w.case() for w in workloads], CPU, **RATES)
    job = Job(tuple(backends), {w.case().id: (w.phase,) for w in workloads}, advisor=True, checks=True)
    cost = job_cost(matrix, job, UNITS)
    weights = step_weights(cost, workloads, backends)
    assert len(weights) == len(workloads) * steps_per_workload(len(backends))
    # every step counted once (floors aside), but the start-up: it is over before the progress clock starts
    assert sum(weights) == pytest.approx(cost.seconds - UNITS.startup_s, rel=1e-3)
    # the first step (the first reference and baseline) took what the estimate said: the line projects the rest
    clock = iter([0.0, weights[0]])
    line = Progress(len(weights), weights=weights, clock=lambda: next(clock), say=lambda line: None).step("ref")
    assert line.endswith(f"~{cost.seconds - UNITS.startup_s - weights[0]:.0f} s left")


def test_cpu_unit_costs_are_the_quiet_fit_when_quiet_the_loaded_fit_when_loaded_and_between_in_between():
    from harness.planning import cost, rates

    quiet, loaded = rates.cpu_rates(0.3), rates.cpu_rates(8.0)  # below the quiet fit's load, past the loaded one's
    assert quiet == replace(rates.CPU_QUIET, load_per_cpu=0.3) and loaded == replace(rates.CPU, load_per_cpu=8.0)
    assert rates.cpu_rates(rates.LOADED_LOAD).key_round_s == pytest.approx(rates.CPU.key_round_s)
    middle = rates.cpu_rates((rates.QUIET_LOAD * rates.LOADED_LOAD) ** 0.5)  # halfway in log load: the geometric mean
    assert middle.call_s == pytest.approx((rates.CPU_QUIET.call_s * rates.CPU.call_s) ** 0.5)
    assert middle.probe_graphs == rates.CPU.probe_graphs and middle.device_type == "cpu"
    seconds = [rates.cpu_rates(load).key_round_s for load in (0.0, 1.0, 1.5, 2.5, 4.0, 5.25, 20.0)]
    assert seconds == sorted(seconds) and seconds[0] < seconds[-1]
    with pytest.raises(ValueError, match="load per CPU nan"):
        rates.cpu_rates(float("nan"))


def test_the_estimate_prices_its_fixed_costs_at_the_load_it_read_and_says_so(monkeypatch):
    from harness.planning import cost, rates

    monkeypatch.setattr(cost, "reference_rate", lambda device: 40e9)
    monkeypatch.setattr(cost, "baseline_rate", lambda device, dtype: 80e9)
    case, job = AttentionCase(1, 4, 64, 32, "fp32"), Job(tuple(get_backends(["naive", "sdpa"])), (FWD,), 3)
    quiet = check_cost([case], CPU, job, allow=False, load=0.5)
    loaded = check_cost([case], CPU, job, allow=False, load=10.0)
    assert quiet.rates.load_per_cpu == 0.5 and "fixed costs at a load average of 0.5 per CPU" in quiet.summary()
    assert loaded.seconds > 2.5 * quiet.seconds  # a small job is its fixed costs
    monkeypatch.setattr(rates.os, "getloadavg", lambda: (3.0, 2.0, 1.0))  # the last minute's, per usable CPU
    monkeypatch.setattr(rates.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert rates.load_per_cpu() == 1.5
    assert check_cost([case], CPU, job, allow=False).rates == rates.cpu_rates(1.5)
