"""One timing round of one phase as data, run next to the kernel (here or in its worker): memory, samples, compile."""

from __future__ import annotations

import functools
import secrets
from dataclasses import dataclass, field

import torch

from harness.backends.base import Backend
from harness.calls.cache import CallCaches
from harness.calls.bound import BoundCall, backend_inputs, modifier_leaves
from harness.calls.call import Call, call_inputs, device_scope, leaf_grads
from harness.calls.content import renewed
from harness.calls.integrity import INPUT_NAMES, RoundGuard
from harness.calls.outcome import Failure, free
from harness.measure.cuda_graph import Captured
from harness.measure.measurement import Measurement
from harness.measure.memory import peak_memory
from harness.measure.stages import STAGE_CLOCK, TIMED_CALLS, stage
from harness.measure import timing as clocks  # clocks.CLOCKS, read where used: one binding for every reading
from harness.measure.timing import TimingConfig, measure
from harness.cases.case import Inputs
from harness.cases.paged import paged_layout, to_paged
from harness.store.schema import BWD, FWD, FWD_BWD, GRADS, OOM


@dataclass(frozen=True)
class TimingCall:
    """Time `phase` of the call's case; estimate_ms, known_memory (bytes, method) from earlier rounds (None: measure
    now); checked: every call on fresh content, checked where it runs and its answers judged (integrity.RoundGuard);
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
    #: content (integrity.Observed), the last call's last; [] unchecked
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


class Phase:
    """One phase's timed call and what a round needs of it, in the order a round uses them: `build` makes what the
    call reads anew (the backward alone's forward, retained), `setup` runs before every call (untimed: the gradients
    reset), `fn` is the timed call - fwd without autograd, bwd the backward alone on the retained graph, fwd+bwd a
    training step; `fresh` writes a call's content into the buffers it reads (all four; the backward alone: dO, on
    the graph it has; the forward alone: q, k, v), `sources` says what those hold for given inputs, and `answers`
    reads what a call returned, by quantity (out, dq, ...), in the canonical layout, not copied."""

    def __init__(self, backend: Backend, case, inputs: Inputs, device: torch.device, phase: str):
        self.backend, self.case, self.phase = backend, case, phase
        self.q, self.k, self.v, self.d_out = backend_inputs(backend, case, inputs, requires_grad=phase != FWD)
        self.leaves = modifier_leaves(inputs, requires_grad=phase != FWD)  # sinks/bias: their gradients are work too
        self.buffers = {"q": self.q, "k": self.k, "v": self.v, "dO": self.d_out, **self.leaves}
        self._forward = functools.partial(BoundCall(backend, case, device, leaves=self.leaves), self.q, self.k, self.v)
        self._built = None
        # the buffers a call's content goes into: the backward alone reads a new dO on the graph it has (its q, k, v
        # stay), the forward alone reads no dO
        self.renewed = tuple(name for name, field in INPUT_NAMES.items() if field in renewed(phase))
        # the buffers are the canonical inputs laid out (a transpose) unless FP8 changes them: a call's content is
        # copied straight into them, one op a buffer, and a paged cache's K or V is scattered into its pages in place
        # (cases.paged.to_paged(into=): the slots no sequence owns keep what they were made with, which the snapshot
        # holds them to; making the cache anew and copying it in was ~60 % of a decode key's round); FP8's inputs
        # are made and copied in
        self.direct = phase == BWD or (case.fp8_kv is None and not case.fp8_q)
        self.pages = paged_layout(case, device) if self.direct and case.page_size is not None else None
        self.paged = tuple(name for name in ("k", "v") if self.pages is not None and name in self.renewed)
        # detached views: written outside autograd without switching grad mode on every call (a leaf's new content is
        # its data, not an operation on it; each call's graph is built after the write)
        self.written = {name: (self.buffers[name] if name in self.paged
                               else backend.from_layout(self.buffers[name])).detach()
                        for name in self.renewed if self.direct}

    def build(self) -> None:
        """The backward alone's forward, made anew: retain_graph lets every repetition run the same backward."""
        if self.phase == BWD:
            self._built = self._forward()

    def setup(self) -> None:
        if self.phase != FWD:  # the forward alone takes no gradients
            for t in (self.q, self.k, self.v, *self.leaves.values()):
                t.grad = None

    def fn(self) -> object:
        if self.phase == FWD:  # as the correctness call runs it: a backend compiled on grad mode compiles once
            with torch.no_grad():
                return self._forward()
        if self.phase == FWD_BWD:
            out = self._forward()
            out.backward(self.d_out)
            return out
        return self._built.backward(self.d_out, retain_graph=True)

    def fresh(self, new: Inputs) -> None:
        # the renewed inputs may come float32 (Contents.call(cast=False)): a buffer's copy_ casts as .to does
        if not self.direct or self.paged:
            new = new._replace(**{field: getattr(new, field).to(self.case.dtype) for field in renewed(self.phase)})
        if not self.direct:
            with torch.no_grad():
                for name, source in self.sources(new).items():
                    self.buffers[name].copy_(source)
            return
        for name, target in self.written.items():
            if name in self.paged:
                to_paged(getattr(new, name), self.pages, into=target)
            else:
                target.copy_(getattr(new, INPUT_NAMES[name]))

    def sources(self, new: Inputs) -> dict[str, torch.Tensor]:
        if self.phase == BWD:
            return {"dO": self.backend.to_layout(new.d_out)}
        made = dict(zip(("q", "k", "v", "dO"), backend_inputs(self.backend, self.case, new, False, copy=False)))
        return {name: made[name] for name in self.renewed}

    def answers(self, value) -> dict[str, torch.Tensor]:
        found = {"out": self.backend.from_layout(value.detach())} if isinstance(value, torch.Tensor) else {}
        if self.phase != FWD:  # sinks and bias: canonical in every layout
            found.update((name, self.backend.from_layout(g) if name in GRADS else g)
                         for name, (g, _) in leaf_grads(self.q, self.k, self.v, self.leaves).items())
        return found


class Replayed:
    """A Phase captured in a CUDA graph (its build in one of its own): its call is a replay, nothing runs before
    one (a reset of .grad would drop the graph's gradients), and a call's content goes into the static inputs the
    replays read; answers read the static output and gradients."""

    def __init__(self, eager: Phase, device: torch.device):
        self.captured = Captured(eager.fn, eager.setup, device, eager.build if eager.phase == BWD else None)
        self.buffers, self.fresh, self.sources, self.answers = eager.buffers, eager.fresh, eager.sources, eager.answers
        self.fn = self.captured.replay

    #: nothing is built or set up between replays (measure takes None as nothing to run)
    build = setup = None


def graph_phase(timed: Phase, device: torch.device) -> tuple[Replayed, Captured]:
    """`timed` captured in a CUDA graph (Replayed), and its capture."""
    replayed = Replayed(timed, device)
    return replayed, replayed.captured


def run_timing(backend: Backend, timing: TimingCall, device: torch.device,
               caches: CallCaches | None = None, ticker=None) -> TimingResult:
    """Measure one round; every failure comes back as a Failure. Checked, every call runs on content no earlier call
    saw and what the calls did is checked where they ran (integrity.RoundGuard); their answers come back (observed);
    ticker: the run's bracket of each call (a worker's; CPU only: on CUDA the events' audit stands)."""
    start = clocks.CLOCKS.now_ns()
    result = TimingResult(started_ns=start)
    case, phase = timing.call.case, timing.phase
    with device_scope(device):
        try:
            with stage("inputs"):
                inputs = call_inputs(timing.call, device, None if caches is None else caches.drawn)
                guard = RoundGuard(case, phase, timing.seed, inputs, ticker if device.type == "cpu" else None,
                                   None if caches is None else caches.pools) if timing.checked else None
                inputs = inputs if guard is None else guard.inputs  # the round's own content

            def built() -> Phase:
                timed = Phase(backend, case, inputs, device, phase)
                if guard is not None:
                    guard.watch(timed)
                return timed

            # On the CPU a first round's memory probe is its first call: the phase built once, watched from before
            # it, and measure told the call is warm; elsewhere the probe is a Phase of its own, freed before timing,
            # so a backward alone's graph is never held twice
            warm = device.type == "cpu" and timing.estimate_ms is None and timing.known_memory is None
            timed = built() if warm else None
            if timing.known_memory is not None:
                result.peak_mem_bytes, result.mem_method = timing.known_memory
            else:
                with stage("peak memory"):
                    probe = timed or Phase(backend, case, inputs, device, phase)
                    probe.build()
                    result.peak_mem_bytes, result.mem_method = peak_memory(probe.fn, device=device, setup=probe.setup)
                    del probe
            budget = timing.cpu_mem_budget
            if budget is not None and device.type == "cpu" and result.peak_mem_bytes > budget:
                result.failure = Failure(OOM, f"needed {result.peak_mem_bytes} bytes above inputs > CPU budget "
                                              f"{budget}")
                return result
            with stage("timing"):
                timed, captured = timed or built(), None
                if timing.config.cuda_graph and device.type == "cuda":
                    timed, captured = graph_phase(timed, device)  # the samples are replays: the guard's too
                measure_start = clocks.CLOCKS.now_ns()
                result.measurement = measure(timed.fn, device=device, setup=timed.setup, config=timing.config,
                                             estimate_ms=timing.estimate_ms, build=None if warm else timed.build,
                                             warm=warm, guard=guard, graph=captured)
                measure_ns = clocks.CLOCKS.now_ns() - measure_start
                # the samples' own time apart: "timing" keeps what the round's loop spent around them (estimate and
                # warm-up calls, each call's content, flushes, synchronisations)
                samples = result.measurement.samples_ms
                STAGE_CLOCK.merge({TIMED_CALLS: (sum(samples) / 1e3, len(samples))})
            result.compile_ms = backend.compile_time_ms()
            if guard is not None:
                with stage("integrity"):
                    result.observed, result.integrity = guard.finish(device)
            # what the round accounts for: a clock that read any part short shows as time nobody accounted for
            m = result.measurement
            outside_ms = (clocks.CLOCKS.now_ns() - start - measure_ns) / 1e6
            result.accounted_ms = outside_ms + m.untimed_ms + sum(m.samples_ms)
        except BaseException as exc:  # noqa: B036 - a backend's SystemExit or KeyboardInterrupt is this round's row
            failure = Failure.of(exc)
            result.failure = Failure(failure.status, f"during timing: {failure.reason}", failure.interrupted)
            free(device)
    return result
