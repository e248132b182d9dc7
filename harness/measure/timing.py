"""How the harness times a call: CUDA events with L2 flush on GPU, a monotonic clock on CPU, budgets in ms."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from harness.measure.cuda_graph import Captured
from harness.measure.measurement import Measurement
from harness.measure.stats import MIN_SAMPLES

#: bytes written before each GPU repetition: larger than any current GPU's L2 (H100/H200 have 50-60 MB)
L2_FLUSH_BYTES = 256 * 2 ** 20


@dataclass(frozen=True)
class Clocks:
    """The clocks timing reads, bound once: a plugin that later rewrites time.perf_counter_ns or torch.cuda.Event's
    methods does not reach them (a worker imports this module before any backend module; docs/integrity.md)."""

    now_ns: Callable[[], int]
    event: Callable[..., object]
    record: Callable[[object, object], None]
    elapsed_ms: Callable[[object, object], float]
    synchronize: Callable[..., None]

    @classmethod
    def bound(cls) -> "Clocks":
        event = torch.cuda.Event
        return cls(time.perf_counter_ns, event, event.record, event.elapsed_time, torch.cuda.synchronize)


#: bound at import, before any backend code runs in a worker (worker_main imports timing before loading modules)
CLOCKS = Clocks.bound()


#: a suite run's time budget per timed key, all rounds together (--timing-budget-ms): triton's do_bench rep=100 ms
BUDGET_MS = 100.0
#: warm-up before the repetitions, as a share of the budget: do_bench's warmup=25 ms of its rep=100 ms
WARMUP_SHARE = 0.25
#: fewest repetitions of a call: what a timing verdict needs a side (a stall can fool 5)
MIN_REPS = MIN_SAMPLES
#: at most this many repetitions a call: a 0.01 ms key would otherwise take 10,000 at the budget
MAX_REPS = 500
#: a CPU call at least this long (ms) is its own warm-up in a later round (benchmarks/slow_call_warmup_study.py)
SELF_WARMING_MS = 100.0


@dataclass(frozen=True)
class TimingConfig:
    """Time budgets (ms) turned into repetition counts per call, as triton's do_bench does; a suite run's defaults."""

    warmup_ms: float = BUDGET_MS * WARMUP_SHARE
    budget_ms: float = BUDGET_MS
    min_reps: int = MIN_REPS
    max_reps: int = MAX_REPS
    cuda_graph: bool = False

    @classmethod
    def for_budget(cls, budget_ms: float, **more) -> "TimingConfig":
        """The config of a time budget (ms), with WARMUP_SHARE of it as warm-up."""
        return cls(budget_ms * WARMUP_SHARE, budget_ms, **more)

    def __post_init__(self):
        if not (self.warmup_ms >= 0 and self.budget_ms > 0 and math.isfinite(self.warmup_ms)
                and math.isfinite(self.budget_ms) and 1 <= self.min_reps <= self.max_reps):
            raise ValueError(f"timing config {self}: budgets must be finite and > 0 and 1 <= min_reps <= max_reps")

    def share(self, rounds: int, index: int = 0) -> "TimingConfig":
        """Round `index` of `rounds`: 1/rounds of the budgets, min_reps split over them (10: 4, 3, 3)."""
        min_reps = max(1, self.min_reps // rounds + (index < self.min_reps % rounds))
        return TimingConfig(self.warmup_ms / rounds, self.budget_ms / rounds, min_reps,
                            max(min_reps, math.ceil(self.max_reps / rounds)), self.cuda_graph)


#: the advisor's budget per backend: 5x a suite key's, and 15 repetitions, twice the 7 a side its alpha needs
ADVISOR_TIMING = TimingConfig.for_budget(500.0, min_reps=15)


def repetitions(estimate_ms: float, cfg: TimingConfig) -> tuple[int, int]:
    """(calls that fill the warm-up budget - each clock sets its own floor -, repetitions within the budget)."""
    estimate_ms = max(estimate_ms, 1e-3)
    return int(cfg.warmup_ms / estimate_ms), int(min(cfg.max_reps, max(cfg.min_reps, cfg.budget_ms / estimate_ms)))


@dataclass(frozen=True)
class CallPlan:
    """The calls measure() makes of one that takes `estimate_ms` (what the cost model counts, measure itself runs):
    a first call kept apart (compilation, lazy init), the estimate's looks, the warm-up, and the timed samples - the
    last look counted as the first sample where no warm-up ran after it."""

    first: int
    looks: int
    warmup: int
    reps: int
    look_is_sample: bool

    @property
    def calls(self) -> int:
        return self.first + self.looks + self.warmup + self.reps - self.look_is_sample


def looks_for(estimate_ms: float, cfg: TimingConfig) -> int:
    """The CPU's estimate calls: a second look only where the estimate sizes the repetitions (a slow call gets
    min_reps whatever it says)."""
    return 1 if estimate_ms >= cfg.budget_ms / cfg.min_reps else 2


def call_plan(estimate_ms: float, cfg: TimingConfig, *, device_type: str, looks: int, warm: bool) -> CallPlan:
    """measure()'s calls once its estimate is known: `looks` the estimate calls made (0: the estimate was given),
    `warm`: no first call kept apart. A GPU estimates from do_bench's 5 calls and warms up with one call at least."""
    warmup, reps = repetitions(estimate_ms, cfg)
    first = 0 if warm or not looks else 1
    if device_type == "cuda":
        return CallPlan(first, 5 if looks else 0, max(1, warmup), reps, False)
    # the estimate calls are warm-up; a known estimate (caches cold since) gets one call unless it warms itself
    warmup = max(warmup - looks, 0 if looks or estimate_ms >= SELF_WARMING_MS else 1)
    return CallPlan(first, looks, warmup, reps, looks > 0 and not warmup and reps > 1)


#: warm-up calls get no content of their own: they repeat the content of the call before them, untimed and unjudged.
#: A fast key's warm-up is most of its calls (its warm-up budget is not capped as its repetitions are: ~830 calls of
#: 10 us before 167 samples), and a content costs a call ~10-20 us; a memo that learns the repeated content gains
#: nothing, since every estimate call and every sample still runs on content no earlier call saw
WARMUP_RENEWS = False


def _nothing() -> None:
    pass


class Timed:
    """What measure() times, as steps around each call: `build` once first (a backward's forward), `setup` before
    every call (untimed), `call` (returns its value), and a round's integrity steps around the calls - none here
    (calls/round.py TimedRound: fresh content before every estimate call and sample, every answer read in full inside
    the call's own timed region, each sample's answer checked as it returns, the last one always). `capture` puts the
    call in a CUDA graph: from then on a call is a replay, and nothing is built or set up between replays (a reset of
    .grad would drop the graph's gradients)."""

    def __init__(self, call: Callable[[], object], setup: Callable[[], None] | None = None,
                 build: Callable[[], None] | None = None):
        self.call, self.setup, self.build = call, setup or _nothing, build or _nothing
        self.captured: Captured | None = None

    def capture(self, device: torch.device) -> Timed:
        self.captured = Captured(self.call, self.setup, device, None if self.build is _nothing else self.build)
        self.call, self.setup, self.build = self.captured.replay, _nothing, _nothing
        return self

    def before_call(self) -> None: ...
    def open(self) -> None: ...
    def close(self, start_ns: int, end_ns: int) -> None: ...
    def in_call(self, value: object) -> None: ...
    def after_call(self, value: object, left: int) -> None: ...
    def after_last_call(self, value: object) -> None: ...


def measure(timed: Timed | Callable[[], object], *, device: torch.device, config: TimingConfig = TimingConfig(),
            estimate_ms: float | None = None, warm: bool = False) -> Measurement:
    """Time `timed.call()` (or a plain function's) repeatedly by call_plan: built first, set up before each call,
    with its steps around every call, estimate and warm-up calls included. estimate_ms: known latency (no estimate
    calls); warm: the call ran once already (the CPU memory probe), so nothing is built and no first call is kept
    apart for compiling; a captured call (Timed.capture) is timed as replays."""
    timed, start = timed if isinstance(timed, Timed) else Timed(timed), CLOCKS.now_ns()
    if device.type == "cuda":
        if config.cuda_graph and timed.captured is None:
            raise ValueError("measure(config.cuda_graph=True) needs a captured call (Timed.capture)")
        m = _measure_cuda(timed, device, config, estimate_ms, warm)
    else:
        if not warm:
            timed.build()
        m = _measure_cpu(timed, config, estimate_ms, warm)
    return replace(m, untimed_ms=(CLOCKS.now_ns() - start) / 1e6 - sum(m.samples_ms))


def _measure_cpu(timed: Timed, cfg: TimingConfig, estimate: float | None, warm: bool) -> Measurement:
    # perf_counter_ns: monotonic and the finest clock Python has; CPU work is synchronous, so no fence is needed.
    now_ns, fn, setup = CLOCKS.now_ns, timed.call, timed.setup

    def call(renew: bool = True) -> tuple[float, object]:
        if renew:
            timed.before_call()
        setup()
        if renew:  # an estimate call or a sample: bracketed by the run's own clock (isolation/brackets.py)
            timed.open()
        start = now_ns()
        value = fn()
        timed.in_call(value)  # the answer read in full before the clock stops: work left for later is timed
        end = now_ns()
        if renew:
            timed.close(start, end)
        return (end - start) / 1e6, value

    looks = []
    if estimate is None:
        if not warm:  # may include compilation or lazy init: kept apart from the samples
            call()
        looks.append(call()[0])
        if looks_for(looks[0], cfg) > 1:
            looks.append(call()[0])
        estimate = min(looks)
    plan = call_plan(estimate, cfg, device_type="cpu", looks=len(looks), warm=warm)
    for _ in range(plan.warmup):  # untimed and unjudged: on the content before them (WARMUP_RENEWS)
        call(renew=WARMUP_RENEWS)
    # with no warm-up call after it, the last estimate call ran as the next will: it is the first sample (never the
    # last: the round sees the last sample's answer)
    samples, reps = (looks[-1:] if plan.look_is_sample else []), plan.reps
    for i in range(len(samples), reps):
        elapsed, value = call()
        # checked before anything else runs: a thread still filling the answer is caught
        timed.after_call(value, reps - 1 - i) if i < reps - 1 else timed.after_last_call(value)
        samples.append(elapsed)
    return Measurement(tuple(samples), "cpu-clock", torch.get_num_threads())


def _measure_cuda(timed: Timed, device, cfg: TimingConfig, estimate: float | None, warm: bool) -> Measurement:
    clocks = CLOCKS  # the event API as bound at import (Clocks)
    with torch.cuda.device(device):  # events record on the current device's stream: make it the run's device
        stream, target, setup = torch.cuda.current_stream(device), timed.call, timed.setup
        mode = "cuda-events" if timed.captured is None else "cuda-graph"
        if not warm:
            timed.build()  # nothing once captured: the graph holds its build

        def call(renew: bool = True) -> object:
            if renew:
                timed.before_call()  # the call's own content, written before the events
            setup()                  # host work (gradient reset) and the flush stay outside the events
            value = target()
            timed.in_call(value)
            return value

        clocks.synchronize(device)
        flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
        looked = estimate is None
        if estimate is None:
            if not warm:
                call()
                clocks.synchronize(device)
            # Estimate from 5 calls, as do_bench does, to size warmup and repetitions from the time budgets.
            est_start, est_end = clocks.event(enable_timing=True), clocks.event(enable_timing=True)
            clocks.record(est_start, stream)
            for _ in range(5):
                call()
            clocks.record(est_end, stream)
            clocks.synchronize(device)
            estimate = clocks.elapsed_ms(est_start, est_end) / 5
        plan = call_plan(estimate, cfg, device_type="cuda", looks=1 if looked else 0, warm=warm)
        reps = plan.reps
        for _ in range(plan.warmup):  # do_bench's floor: at least one call; on the content before (WARMUP_RENEWS)
            call(renew=WARMUP_RENEWS)
        starts, ends = ([clocks.event(enable_timing=True) for _ in range(reps)] for _ in range(2))
        clocks.synchronize(device)
        host_start = clocks.now_ns()  # the host clock around the repetitions: the events' span must agree with it
        for i in range(reps):
            timed.before_call()
            setup()
            flush.zero_()      # clear L2 so every repetition reads its inputs from HBM, like a real model step
            clocks.record(starts[i], stream)  # events bracket the call's kernels on this device's current stream
            value = target()
            timed.in_call(value)  # the answer read in full on this stream, inside the events
            clocks.record(ends[i], stream)
            # a copy enqueued behind the call, after its end event
            timed.after_call(value, reps - 1 - i) if i < reps - 1 else timed.after_last_call(value)
        clocks.synchronize(device)
        host_ms = (clocks.now_ns() - host_start) / 1e6
    samples = tuple(clocks.elapsed_ms(s, e) for s, e in zip(starts, ends))
    return Measurement(samples, mode, torch.get_num_threads(),
                       event_vs_host=(clocks.elapsed_ms(starts[0], ends[-1]), host_ms))
