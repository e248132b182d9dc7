"""One timing round of one phase asked for and answered (TimingCall, TimingResult), and run_timing, which runs it next
to the kernel (here or in its worker): its inputs, memory, the round's calls (calls/round.py), compile."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import torch

from harness.backends.base import Backend
from harness.calls.cache import CallCaches
from harness.calls.call import Call, call_inputs, device_scope
from harness.calls.content import Contents
from harness.calls.outcome import Failure, free
from harness.calls.round import Ticking, TimedRound
from harness.measure.measurement import Measurement
from harness.measure.memory import peak_memory
from harness.measure.stages import STAGE_CLOCK, TIMED_CALLS, stage
from harness.measure import timing as clocks  # clocks.CLOCKS, read where used: one binding for every reading
from harness.measure.timing import TimingConfig, measure
from harness.store.schema import OOM


@dataclass(frozen=True)
class TimingCall:
    """Time `phase` of the call's case; estimate_ms, known_memory (bytes, method) from earlier rounds (None: measure
    now); checked: every call on fresh content, checked where it runs and its answers judged (round.TimedRound);
    seed: the round's contents' (content.Contents), drawn by `secrets` where the request is made - the run's
    process, which makes a judged call's content again from it."""

    call: Call
    phase: str
    config: TimingConfig
    estimate_ms: float | None = None
    known_memory: tuple[int, str] | None = None
    cpu_mem_budget: int | None = None
    checked: bool = True
    seed: int = field(default_factory=lambda: secrets.randbits(63))


@dataclass
class TimingResult:
    measurement: Measurement | None = None
    peak_mem_bytes: int | None = None
    mem_method: str | None = None
    failure: Failure | None = None
    compile_ms: float | None = None
    #: the judged calls' answers as they returned, with what was read of them inside their timed region and their
    #: content (round.Observed), the last call's last; [] unchecked
    observed: list = field(default_factory=list)
    #: the integrity rules the timed calls broke where they ran; '' when none
    integrity: str = ""
    #: the round (ms) as the timing process's clocks account for it (its work around `measure`, measure's own, the
    #: samples), and by the run's clock from its request to the reply (None: not timed): audit.clock_audit
    accounted_ms: float | None = None
    wall_ms: float | None = None
    #: the timing process's clock as the round started, and the run's as it sent the request (ns; one system-wide
    #: monotonic clock): a round cannot start before it was asked for, so a clock left behind shows here
    started_ns: int | None = None
    asked_ns: int | None = None
    #: the share of the machine's CPU time that processes other than the worker and the run took during the round
    #: (0-1, read by the run's process: neighbours.EqualMachine; None: not read)
    others_share: float | None = None
    #: what the run's process saw of the round's calls (isolation/brackets.Witnessed: each one's bracket, nonce and
    #: committed checksums, the calls it drew to be judged): set by the run; None: not bracketed (in-process, CUDA)
    witness: object | None = None
    #: the seed the round's contents were made from, as the run asked (audit.audited_time): what it is judged on
    seed: int | None = None

    @property
    def interrupted(self) -> bool:
        return self.failure is not None and self.failure.interrupted


def run_timing(backend: Backend, timing: TimingCall, device: torch.device,
               caches: CallCaches | None = None, ticker: Ticking | None = None) -> TimingResult:
    """Measure one round; every failure comes back as a Failure. Checked, every call runs on content no earlier call
    saw and what the calls did is checked where they ran (round.TimedRound); their answers come back (observed);
    ticker: the run's bracket of each call (a worker's; CPU only: on CUDA the events' audit stands)."""
    start = clocks.CLOCKS.now_ns()
    result = TimingResult(started_ns=start)
    case, phase = timing.call.case, timing.phase
    with device_scope(device):
        try:
            with stage("inputs"):
                inputs = call_inputs(timing.call, device, None if caches is None else caches.drawn)
                contents = Contents(case, phase, timing.seed, inputs.q.device, inputs.sinks, inputs.bias,
                                    None if caches is None else caches.pools) if timing.checked else None
                inputs = inputs if contents is None else contents.round  # the round's own content

            def built() -> TimedRound:
                # the run brackets a checked round's calls on a CPU (on CUDA the events' audit stands)
                return TimedRound(backend, case, phase, device, inputs, contents,
                                  ticker if device.type == "cpu" and contents is not None else None)

            # On the CPU a first round's memory probe is its first call: the round built once, and measure told the
            # call is warm; elsewhere the probe is an unchecked round of its own, freed before timing, so a backward
            # alone's graph is never held twice
            warm = device.type == "cpu" and timing.estimate_ms is None and timing.known_memory is None
            timed = built() if warm else None
            if timing.known_memory is not None:
                result.peak_mem_bytes, result.mem_method = timing.known_memory
            else:
                with stage("peak memory"):
                    probe = timed or TimedRound(backend, case, phase, device, inputs)
                    probe.build()
                    result.peak_mem_bytes, result.mem_method = peak_memory(probe.call, device=device,
                                                                           setup=probe.setup)
                    del probe
            budget = timing.cpu_mem_budget
            if budget is not None and device.type == "cpu" and result.peak_mem_bytes > budget:
                result.failure = Failure(OOM, f"needed {result.peak_mem_bytes} bytes above inputs > CPU budget "
                                              f"{budget}")
                return result
            with stage("timing"):
                timed = timed or built()
                if timing.config.cuda_graph and device.type == "cuda":
                    timed.capture(device)  # the samples are replays, the checks around them too
                measure_start = clocks.CLOCKS.now_ns()
                result.measurement = measure(timed, device=device, config=timing.config,
                                             estimate_ms=timing.estimate_ms, warm=warm)
                measure_ns = clocks.CLOCKS.now_ns() - measure_start
                # the samples' own time apart: "timing" keeps what the round's loop spent around them (estimate and
                # warm-up calls, each call's content, flushes, synchronisations)
                samples = result.measurement.samples_ms
                STAGE_CLOCK.merge({TIMED_CALLS: (sum(samples) / 1e3, len(samples))})
            result.compile_ms = backend.compile_time_ms()
            with stage("integrity"):
                result.observed, result.integrity = timed.finish(device)
            # what the round accounts for: a clock that read any part short shows as time nobody accounted for
            m = result.measurement
            outside_ms = (clocks.CLOCKS.now_ns() - start - measure_ns) / 1e6
            result.accounted_ms = outside_ms + m.untimed_ms + sum(m.samples_ms)
        except BaseException as exc:  # noqa: B036 - a backend's SystemExit or KeyboardInterrupt is this round's row
            failure = Failure.of(exc)
            result.failure = Failure(failure.status, f"during timing: {failure.reason}", failure.interrupted)
            free(device)
    return result
