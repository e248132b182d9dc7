"""One timing round of one phase, described as data so it runs where the backend runs (here or in its worker):
peak memory, the repetitions, the compile time. Timing stays next to the kernel, so isolation costs no latency."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from harness.backends.base import Backend
from harness.execution.cache import CallCaches
from harness.execution.call import (BoundCall, Call, backend_inputs, call_inputs, device_scope, modifier_leaves,
                                    timed_call)
from harness.execution.integrity import RoundInputs, Snapshot, Transform, aliased, same_bits, seen_violation
from harness.execution.outcome import Failure, free
from harness.measure.cuda_graph import Captured
from harness.measure.memory import CPU_METHOD, first_call_peak, peak_memory
from harness.measure.stages import stage
from harness.measure.timing import Measurement, TimingConfig, measure
from harness.spec.case import Inputs
from harness.spec.modifiers import MODIFIER_GRADS
from harness.store.schema import FWD, FWD_BWD, GRADS, OOM


@dataclass(frozen=True)
class TimingCall:
    """Time `phase` of the call's case: estimate_ms from earlier rounds (None: estimate now); known_memory (bytes,
    method) from an earlier round (None: measure it); over cpu_mem_budget bytes of peak memory on the CPU is oom.
    inputs: the round's transforms of the verified inputs (integrity.round_inputs; None: the verified inputs, and
    nothing is observed - a re-measurement or a study). verified: the answer id of the verdict's call
    (CallResult.answer_id): an answer that is one it kept, scaled, is told rather than sent back."""

    call: Call
    phase: str
    config: TimingConfig
    estimate_ms: float | None = None
    known_memory: tuple[int, str] | None = None
    cpu_mem_budget: int | None = None
    inputs: RoundInputs | None = None
    verified: str = ""


@dataclass
class Observed:
    """What a timed call returned, read right after it returned, on the CPU in the canonical layout: the output
    (fwd, fwd+bwd) and the gradients (bwd, fwd+bwd), and the transform its inputs were made with."""

    transform: Transform
    out: torch.Tensor | None = None
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    #: quantities whose answer was, bit for bit, the verified answer of the call (TimingCall.verified) times the
    #: transform's factor, or the last call's times the ratio of the transforms' factors: told where the calls ran,
    #: the tensor does not travel, and its Check is that answer's, scaled (judge_timed)
    scaled_verified: frozenset[str] = frozenset()
    scaled_last: frozenset[str] = frozenset()

    def answer(self, quantity: str) -> torch.Tensor | None:
        return self.out if quantity == "out" else self.grads.get(quantity)


@dataclass
class TimingResult:
    measurement: Measurement | None = None
    peak_mem_bytes: int | None = None
    mem_method: str | None = None
    failure: Failure | None = None
    compile_ms: float | None = None
    #: the last repetition on the inputs seen, then the last one on new inputs (empty: nothing observed)
    observed: list[Observed] = field(default_factory=list)
    #: why the timed calls broke an integrity rule judged where they ran (inputs written, output aliased, faster
    #: on inputs seen); '' when none
    integrity: str = ""

    @property
    def interrupted(self) -> bool:
        return self.failure is not None and self.failure.interrupted


@dataclass
class Phase:
    """What timing a phase runs: `setup` before every repetition (outside the timed region), `fn` the timed call,
    and `build`, what fn reads made anew (a backward's forward), run before any of it - on the capture stream
    when timed as a CUDA graph, and captured there too.
    buffers: the call's inputs by name (q, k, v, dO, sinks, bias); refill(inputs): new values into the buffers
    (for the backward alone, only those whose bits change), and returns what it copied from by name (tensors equal
    to the buffers bit for bit that no call is given, as a Snapshot's copies); renew(inputs): refill, and for the
    backward alone a new forward when q, k or v changed (returning refill's); rehearse(inputs): renew's work with
    the buffers and the forward left as they are (what precedes a call on seen inputs in the speed rule's pairs);
    observe(value): a copy of what the call returned (Observed's tensors, on the device, the backend's layout)."""

    setup: Callable[[], None] | None
    fn: Callable[[], object]
    build: Callable[[], None] | None = None
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    renew: Callable[[Inputs], dict[str, torch.Tensor]] | None = None
    observe: Callable[[object], tuple[torch.Tensor | None, dict[str, torch.Tensor]]] | None = None
    refill: Callable[[Inputs], dict[str, torch.Tensor]] | None = None
    rehearse: Callable[[Inputs], None] | None = None


def phase_callables(backend: Backend, case, inputs, device: torch.device, phase: str) -> Phase:
    """The Phase of fwd (inference, no autograd), bwd (the backward alone, on a retained graph, with the shared
    dO) or fwd+bwd (one training step). Gradients are reset in setup; the backend's `prepare` runs here, once."""
    q, k, v, d_out = backend_inputs(backend, case, inputs, requires_grad=phase != FWD)
    leaves = modifier_leaves(inputs, requires_grad=phase != FWD)  # sinks/bias: their gradients are work too
    call = BoundCall(backend, case, device, leaves=leaves)
    buffers = {"q": q, "k": k, "v": v, "dO": d_out, **leaves}
    judged = [*zip(GRADS, (q, k, v)), *((MODIFIER_GRADS[n], t) for n, t in leaves.items())]
    built: list = []

    def forward():
        return call(q, k, v)

    def reset():
        for t in (q, k, v, *leaves.values()):
            t.grad = None

    copied: list[str] = []

    def refill(new: Inputs) -> dict[str, torch.Tensor]:
        # the values alone (no copy of their own): the buffers are what the calls get, these only what they held
        sources = dict(zip(("q", "k", "v", "dO"), backend_inputs(backend, case, new, requires_grad=False, copy=False)))
        copied.clear()
        with torch.no_grad():
            for (name, theirs), mine in zip(sources.items(), (q, k, v, d_out)):
                if built and same_bits(mine.detach(), theirs):  # the backward alone's unchanged leaf is left alone:
                    continue                                       # its retained graph stays valid
                mine.copy_(theirs)
                copied.append(name)
        return sources

    def renew(new: Inputs) -> dict[str, torch.Tensor]:
        sources = refill(new)
        if built and {"q", "k", "v"} & set(copied):  # the backward alone on new q, k or v: a new forward (a graph
            build()                                  # of its own); a new dO alone runs on the graph already built
        return sources

    def rehearse(new: Inputs) -> None:
        # renew's copies and forward, into scratch: the buffers' contents, versions and graph stay what the last
        # call saw, so a cache keyed by content, identity or graph still hits on the call after this
        with torch.no_grad():
            for mine, theirs in zip((q, k, v, d_out), backend_inputs(backend, case, new, requires_grad=False)):
                torch.empty_like(mine).copy_(theirs)
        if built:
            forward()

    def observe(value) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        out = value.detach().clone() if isinstance(value, torch.Tensor) else None
        if out is not None and out.is_floating_point():  # its block, freed, must not hand this answer on
            with torch.no_grad():
                value.detach().fill_(float("nan"))
        grads = {} if phase == FWD else {name: (t.grad if t.grad is not None else torch.zeros_like(t)).clone()
                                         for name, t in judged}
        return out, grads

    if phase == FWD:
        def inference():  # as the correctness call runs it: a compiled backend guarded on grad mode compiles once
            with torch.no_grad():
                return forward()
        return Phase(None, inference, None, buffers, renew, observe, refill, rehearse)
    if phase == FWD_BWD:
        def step():
            out = forward()
            out.backward(d_out)
            return out
        return Phase(reset, step, None, buffers, renew, observe, refill, rehearse)

    def build():  # the forward, made anew; retain_graph lets every repetition run the same backward alone
        built[:] = [forward()]

    return Phase(reset, lambda: built[0].backward(d_out, retain_graph=True), build, buffers, renew, observe, refill,
                 rehearse)


def graph_phase(timed: Phase, device: torch.device) -> tuple[Phase, Captured]:
    """`timed` captured in a CUDA graph (its build in a graph of its own), as a Phase whose call is a replay: no
    setup (it ran before the capture), renew refills the static inputs and replays the build from them, and what
    a replay returns (the static output; the gradients the graph writes stay the leaves' .grad) is observed."""
    captured = Captured(timed.fn, timed.setup, device, timed.build)

    def renew(new: Inputs) -> dict[str, torch.Tensor]:
        sources = timed.refill(new)
        captured.rebuild()
        return sources

    return (Phase(None, captured.replay, None, timed.buffers, renew, timed.observe, timed.refill, timed.rehearse),
            captured)


def allow_backward_replay() -> None:
    """Let a compiled backend's backward run again on the same graph, as the bwd phase does (retain_graph=True).

    AOTAutograd donates the forward's saved buffers to the backward by default and then refuses retain_graph:
    seen on an H200 (torch 2.11), flex's every bwd row was "This backward function was compiled with non-empty
    donated buffers which requires create_graph=False and retain_graph=False". Only graphs compiled after this
    call are affected, so a process calls it before any backend runs (the run's session, each worker)."""
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, "donated_buffer"):  # torch >= 2.5
        functorch_config.donated_buffer = False


def run_timing(backend: Backend, timing: TimingCall, device: torch.device,
               caches: CallCaches | None = None) -> TimingResult:
    """Measure one round; every failure (raised, oom, over the CPU budget) comes back as a Failure. Seeded inputs
    are drawn through `caches` (call_inputs), where the verdict's answers are found (TimingCall.verified). With the
    round's transforms (timing.inputs), its calls are given the seen inputs, the last one new inputs, and what the
    last two returned comes back (observed) to be judged; integrity says what they did that no honest call does
    (docs/integrity.md)."""
    result = TimingResult()
    with device_scope(device):
        try:
            with stage("inputs"):
                verified = call_inputs(timing.call, device, None if caches is None else caches.drawn)
                kept = _kept(caches, timing)
                plan = timing.inputs
                inputs = verified if plan is None else plan.seen.inputs(verified)
            case, phase = timing.call.case, timing.phase
            # On the CPU the round's first call (kept apart from the samples) is also its memory probe, and its
            # time is handed to measure; elsewhere, or when the latency is already known (no first call), the probe
            # is a call of its own.
            # the checks see the buffers before any call is made on them (an input written by the first call too)
            timed, checks, first_ms = None, None, None
            if timing.known_memory is not None:
                result.peak_mem_bytes, result.mem_method = timing.known_memory
            elif device.type == "cpu" and timing.estimate_ms is None:
                with stage("timing"):
                    timed = phase_callables(backend, case, inputs, device, phase)
                    checks = None if plan is None else _Checks(backend, timed, verified, plan, kept)
                with stage("peak memory"):
                    if timed.build is not None:
                        timed.build()  # made once: measure is not given it again
                    first_ms, result.peak_mem_bytes = first_call_peak(timed.fn, timed.setup)
                    result.mem_method = CPU_METHOD
            else:
                with stage("peak memory"):
                    probe = phase_callables(backend, case, inputs, device, phase)
                    if probe.build is not None:
                        probe.build()
                    result.peak_mem_bytes, result.mem_method = peak_memory(probe.fn, device=device,
                                                                           setup=probe.setup)
                    del probe
            if _over_budget(result, timing, device):
                return result
            with stage("timing"):
                if timed is None:
                    timed = phase_callables(backend, case, inputs, device, phase)
                    checks = None if plan is None else _Checks(backend, timed, verified, plan, kept)
                captured = None
                if timing.config.cuda_graph and device.type == "cuda" and checks is not None:
                    # the samples are replays: the checks renew, observe and confirm the graph, not an eager call
                    timed, captured = graph_phase(timed, device)
                    checks.timed = timed
                result.measurement = measure(timed.fn, device=device, setup=timed.setup, config=timing.config,
                                             estimate_ms=timing.estimate_ms,
                                             build=None if first_ms is not None else timed.build, first_ms=first_ms,
                                             renew=None if checks is None else checks.renew,
                                             observe=None if checks is None else checks.observe, graph=captured)
            result.compile_ms = backend.compile_time_ms()
            if checks is not None:
                with stage("integrity"):
                    result.observed, result.integrity = checks.finish(result.measurement, device)
        except BaseException as exc:  # noqa: B036 - a backend's SystemExit or KeyboardInterrupt is this round's row
            failure = Failure.of(exc)
            result.failure = Failure(failure.status, f"during timing: {failure.reason}", failure.interrupted)
            free(device)
    return result


class _Checks:
    """A round's integrity checks where the calls run: its inputs as given (a snapshot before the seen inputs and
    one before the new), its outputs owned, what the last two calls returned, and the speed on new inputs."""

    def __init__(self, backend: Backend, timed: Phase, verified: Inputs, plan: RoundInputs,
                 kept: dict[str, torch.Tensor] | None = None):
        self.backend, self.timed, self.verified, self.plan = backend, timed, verified, plan
        self.kept = kept or {}
        self.snapshot = Snapshot(timed.buffers)
        self.problems: list[str] = []
        self.observed: list[Observed] = []
        self._renewed = False

    def renew(self) -> None:
        """Before the last repetition: what the seen calls wrote, then the new inputs into the same buffers."""
        self._note(self.snapshot.written())
        copied_from = self.timed.renew(self.plan.new.inputs(self.verified))
        self.snapshot = Snapshot(self.timed.buffers, copied_from)
        self._renewed = True

    def observe(self, value, renewed: bool) -> None:
        if renewed:
            self._note(aliased(value, self.timed.buffers))
        out, grads = self.timed.observe(value)
        self.observed.append(Observed(self.plan.new if renewed else self.plan.seen, out, grads))

    def finish(self, m: Measurement, device: torch.device) -> tuple[list[Observed], str]:
        """(what was observed, on the CPU in the canonical layout; the integrity problems, '' when none), once
        the device is synchronised; a last call faster on seen inputs is confirmed on more new ones first."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self._note(self.snapshot.written())
        seen, new = m.samples_ms[:-1], m.samples_ms[-1:]
        if self._renewed and seen_violation(seen, new):  # a graph's too: its last sample replays on new inputs
            repeats, confirmed = self._confirm(device)
            # slower than the pairs' repeats and than the round's own calls on seen inputs: a cache is fast on
            # both, while on a loaded VM one lucky repeat beside one stalled new call is not (an FP8 case has one
            # confirming pair: e4m3 leaves few exact transforms)
            if seen_violation(seen, confirmed):
                self._note(seen_violation(repeats, confirmed))
        for o in self.observed:
            o.out = None if o.out is None else self.backend.from_layout(o.out).cpu()
            o.grads = {n: (self.backend.from_layout(g) if n in GRADS else g).cpu() for n, g in o.grads.items()}
        _drop_scaled(self.observed, self.kept)
        return self.observed, "; ".join(self.problems)

    def _confirm(self, device: torch.device) -> tuple[list[float], list[float]]:
        """(calls on inputs just seen, calls on new ones), in pairs: a call on a confirming input set (a new graph
        for the backward alone; with a CUDA graph, a replay on the refilled inputs), then one more on the same
        inputs - so a stall of the machine falls on both sides alike, and a cache kept per graph, identity or
        content hits on the second. Both calls of a pair come right after the same work (renew before the first,
        rehearse before the second): a pause before one side alone (the new inputs' copies, the snapshots) made an
        honest bf16 CPU call 8-16x slower than its repeat on a loaded 2-core VM, and rejected it (docs/integrity.md)."""
        seen, new = [], []
        for transform in self.plan.confirm:
            inputs = transform.inputs(self.verified)
            for times, prelude in ((new, self.timed.renew), (seen, self.timed.rehearse)):
                prelude(inputs)
                if self.timed.setup is not None:
                    self.timed.setup()
                times.append(_once(self.timed.fn, device))
            if not seen_violation(seen[-1:], new[-1:]):  # every pair must be slower on new inputs: this one was not
                break
        return seen, new

    def _note(self, problem: str) -> None:
        if problem and problem not in self.problems:
            self.problems.append(problem)


def _kept(caches: CallCaches | None, timing: TimingCall) -> dict[str, torch.Tensor]:
    """The answers of the verdict's call this process kept (TimingCall.verified), of the call the phase makes, by
    quantity; none when it kept none (another process ran it, or they were dropped for size)."""
    if caches is None or timing.verified not in caches.answers:
        return {}
    call = timed_call(timing.phase)
    return {quantity: t for (kind, quantity), t in caches.answers.get(timing.verified).items() if kind == call}


def _drop_scaled(observed: list[Observed], kept: dict[str, torch.Tensor]) -> None:
    """Each answer that is, bit for bit, the kept verified one times its transform's factor, or (an earlier call's)
    the last call's times the ratio of their factors (a deterministic kernel's: the transforms are exact), is
    dropped and named in `scaled_verified` or `scaled_last`: what a round sends back from a worker and judges
    (a default run's observed answers cost ~4 s of worker pipe when they all travelled)."""
    for o in observed:
        same = {quantity for quantity, answer in kept.items()
                if _equal(o.answer(quantity), answer, o.transform.factor(quantity))}
        o.scaled_verified = frozenset(same)
        _drop(o, same)
    last = observed[-1] if observed else None
    for o in observed[:-1]:
        same = {quantity for quantity in ("out", *o.grads) if last.answer(quantity) is not None and _equal(
            o.answer(quantity), last.answer(quantity), o.transform.factor(quantity) / last.transform.factor(quantity))}
        o.scaled_last = frozenset(same)
        _drop(o, same)


def _equal(answer: torch.Tensor | None, base: torch.Tensor, factor: float) -> bool:
    """`answer` is `base` times `factor` (a signed power of two), bit for bit."""
    return (answer is not None and answer.shape == base.shape and answer.dtype == base.dtype
            and torch.equal(answer, base * factor))


def _drop(o: Observed, quantities: set[str]) -> None:
    o.out = None if "out" in quantities else o.out
    o.grads = {n: g for n, g in o.grads.items() if n not in quantities}


def _once(fn: Callable[[], object], device: torch.device) -> float:
    """One call's latency (ms), by the clock the samples used: CUDA events on the device, else perf_counter."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end)
    begin = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - begin) / 1e6


def _over_budget(result: TimingResult, timing: TimingCall, device: torch.device) -> bool:
    """Set the round's oom failure when its peak memory is over the CPU budget; True then."""
    budget = timing.cpu_mem_budget
    if budget is not None and device.type == "cpu" and result.peak_mem_bytes > budget:
        result.failure = Failure(OOM, f"needed {result.peak_mem_bytes} bytes above inputs > CPU budget {budget}")
        return True
    return False


def fidelity_of(backend: Backend, device: torch.device, case, seed: int):
    """The forward of `backend` on `case` timed by the harness and by an independent timer, interleaved
    (measure.fidelity); runs where the backend runs, like every timing."""
    from harness.measure.fidelity import fidelity

    call = BoundCall(backend, case, device)
    q, k, v, _ = backend_inputs(backend, case, call_inputs(Call(case, seed), device), requires_grad=False)
    with device_scope(device), torch.no_grad(), stage("fidelity"):
        return fidelity(lambda: call(q, k, v), device)
