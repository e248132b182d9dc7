"""One timing round of one phase as data, run next to the kernel (here or in its worker): memory, samples, compile."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from harness.backends.base import Backend
from harness.execution.cache import CallCaches
from harness.execution.call import (BoundCall, Call, backend_inputs, call_inputs, device_scope, modifier_leaves,
                                    poison, timed_call)
from harness.execution.integrity import RoundInputs, Snapshot, Transform, aliased, same_bits, seen_violation
from harness.execution.outcome import Failure, free
from harness.measure.cuda_graph import Captured
from harness.measure.memory import peak_memory
from harness.measure.stages import stage
from harness.measure.timing import Measurement, TimingConfig, measure
from harness.spec.case import Inputs
from harness.spec.modifiers import MODIFIER_GRADS
from harness.store.schema import FWD, FWD_BWD, GRADS, OOM


@dataclass(frozen=True)
class TimingCall:
    """Time `phase` of the call's case; estimate_ms, known_memory (bytes, method) from earlier rounds (None: measure
    now); inputs: the round's transforms (None: nothing observed); verified: the verdict call's answer id."""

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
    """What a timed call returned (CPU, canonical layout) and the transform its inputs were made with."""

    transform: Transform
    out: torch.Tensor | None = None
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    #: quantities whose answer was, bit for bit, the verified one (or the last call's) scaled: dropped where the
    #: calls ran, judged by that answer's Check, scaled (judge_timed)
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
    #: the integrity rules the timed calls broke where they ran; '' when none
    integrity: str = ""

    @property
    def interrupted(self) -> bool:
        return self.failure is not None and self.failure.interrupted


@dataclass
class Phase:
    """What timing a phase runs: `setup` before every repetition (untimed), `fn` the timed call, `build` what fn
    reads made anew; buffers: the call's inputs by name; refill, renew, rehearse, observe: docs/design/execution.md."""

    setup: Callable[[], None] | None
    fn: Callable[[], object]
    build: Callable[[], None] | None = None
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    renew: Callable[[Inputs], dict[str, torch.Tensor]] | None = None
    observe: Callable[[object], tuple[torch.Tensor | None, dict[str, torch.Tensor]]] | None = None
    refill: Callable[[Inputs], dict[str, torch.Tensor]] | None = None
    rehearse: Callable[[Inputs], None] | None = None


def phase_callables(backend: Backend, case, inputs, device: torch.device, phase: str) -> Phase:
    """The Phase of fwd (no autograd), bwd (the backward alone, on a retained graph) or fwd+bwd (a training step)."""
    q, k, v, d_out = backend_inputs(backend, case, inputs, requires_grad=phase != FWD)
    leaves = modifier_leaves(inputs, requires_grad=phase != FWD)  # sinks/bias: their gradients are work too
    call = BoundCall(backend, case, device, leaves=leaves)
    buffers = {"q": q, "k": k, "v": v, "dO": d_out, **leaves}
    judged = [*zip(GRADS, (q, k, v)), *((MODIFIER_GRADS[n], t) for n, t in leaves.items())]
    built: list = []

    forward = functools.partial(call, q, k, v)

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
        if out is not None:
            poison(value)
        grads = {} if phase == FWD else {name: (t.grad if t.grad is not None else torch.zeros_like(t)).clone()
                                         for name, t in judged}
        return out, grads

    def inference():  # as the correctness call runs it: a compiled backend guarded on grad mode compiles once
        with torch.no_grad():
            return forward()

    def step():
        out = forward()
        out.backward(d_out)
        return out

    def build():  # the forward, made anew; retain_graph lets every repetition run the same backward alone
        built[:] = [forward()]

    if phase == FWD:
        return Phase(None, inference, None, buffers, renew, observe, refill, rehearse)
    if phase == FWD_BWD:
        return Phase(reset, step, None, buffers, renew, observe, refill, rehearse)
    return Phase(reset, lambda: built[0].backward(d_out, retain_graph=True), build, buffers, renew, observe, refill,
                 rehearse)


def graph_phase(timed: Phase, device: torch.device) -> tuple[Phase, Captured]:
    """`timed` captured in a CUDA graph (its build in one of its own), as a Phase whose call is a replay; renew
    refills the static inputs and replays the build."""
    captured = Captured(timed.fn, timed.setup, device, timed.build)

    def renew(new: Inputs) -> dict[str, torch.Tensor]:
        sources = timed.refill(new)
        captured.rebuild()
        return sources

    return replace(timed, setup=None, fn=captured.replay, build=None, renew=renew), captured


def allow_backward_replay() -> None:
    """Let a compiled backward run again on one graph (retain_graph), before any backend runs: AOTAutograd's donated
    buffers refuse it (flex's every bwd row on an H200, torch 2.11)."""
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, "donated_buffer"):  # torch >= 2.5
        functorch_config.donated_buffer = False


def run_timing(backend: Backend, timing: TimingCall, device: torch.device,
               caches: CallCaches | None = None) -> TimingResult:
    """Measure one round; every failure comes back as a Failure. With the round's transforms, the calls get the seen
    inputs, the last one new inputs; what the last two returned comes back (observed) to be judged."""
    result = TimingResult()
    with device_scope(device):
        try:
            with stage("inputs"):
                verified = call_inputs(timing.call, device, None if caches is None else caches.drawn)
                kept = _kept(caches, timing)
                plan = timing.inputs
                inputs = verified if plan is None else plan.seen.inputs(verified)
            case, phase = timing.call.case, timing.phase
            timed, checks, first_done = None, None, False
            if timing.known_memory is not None:
                result.peak_mem_bytes, result.mem_method = timing.known_memory
            else:
                # On the CPU a first round's probe is its first timed call (built once: measure is not given the build
                # again), the checks seeing the buffers before it; elsewhere the probe is a Phase of its own, freed
                # before timing, so a backward alone's graph is never held twice
                first_done = device.type == "cpu" and timing.estimate_ms is None
                if first_done:
                    with stage("timing"):
                        timed = phase_callables(backend, case, inputs, device, phase)
                        checks = None if plan is None else _Checks(backend, timed, verified, plan, kept)
                with stage("peak memory"):
                    probe = timed if first_done else phase_callables(backend, case, inputs, device, phase)
                    if probe.build is not None:
                        probe.build()
                    result.peak_mem_bytes, result.mem_method = peak_memory(probe.fn, device=device, setup=probe.setup)
                    del probe
            budget = timing.cpu_mem_budget
            if budget is not None and device.type == "cpu" and result.peak_mem_bytes > budget:
                result.failure = Failure(OOM, f"needed {result.peak_mem_bytes} bytes above inputs > CPU budget "
                                              f"{budget}")
                return result
            with stage("timing"):
                if timed is None:
                    timed = phase_callables(backend, case, inputs, device, phase)
                    checks = None if plan is None else _Checks(backend, timed, verified, plan, kept)
                captured = None
                if timing.config.cuda_graph and device.type == "cuda":
                    # the samples are replays: the checks renew, observe and confirm the graph, not an eager call
                    timed, captured = graph_phase(timed, device)
                    if checks is not None:
                        checks.timed = timed
                result.measurement = measure(timed.fn, device=device, setup=timed.setup, config=timing.config,
                                             estimate_ms=timing.estimate_ms,
                                             build=None if first_done else timed.build, first_done=first_done,
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
    """A round's integrity checks where the calls run: inputs left as given, outputs owned, speed on new inputs."""

    def __init__(self, backend: Backend, timed: Phase, verified: Inputs, plan: RoundInputs,
                 kept: dict[str, torch.Tensor] | None = None):
        self.backend, self.timed, self.verified, self.plan = backend, timed, verified, plan
        self.kept = kept  # None: every answer goes back to be judged (a worker: nothing is elided where it ran)
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
        """(what was observed, CPU, canonical layout; the integrity problems, '' when none)."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self._note(self.snapshot.written())
        seen, new = m.samples_ms[:-1], m.samples_ms[-1:]
        if self._renewed and seen_violation(seen, new):  # a graph's too: its last sample replays on new inputs
            repeats, confirmed = self._confirm(device)
            # slower than both the pairs' repeats and the round's seen calls: a cache is fast on both, while on a
            # loaded VM one lucky repeat beside one stalled new call is not
            if seen_violation(seen, confirmed):
                self._note(seen_violation(repeats, confirmed))
        for o in self.observed:
            o.out = None if o.out is None else self.backend.from_layout(o.out).cpu()
            o.grads = {n: (self.backend.from_layout(g) if n in GRADS else g).cpu() for n, g in o.grads.items()}
        if self.kept is not None:
            _drop_scaled(self.observed, self.kept)
        return self.observed, "; ".join(self.problems)

    def _confirm(self, device: torch.device) -> tuple[list[float], list[float]]:
        """(calls on inputs just seen, calls on new ones), in pairs after the same work (docs/design/execution.md);
        ([], []) when a pair was not slower on its new inputs: every pair must be, for a rejection."""
        seen, new = [], []
        for transform in self.plan.confirm:
            inputs = transform.inputs(self.verified)
            for times, prelude in ((new, self.timed.renew), (seen, self.timed.rehearse)):
                prelude(inputs)
                if self.timed.setup is not None:
                    self.timed.setup()
                times.append(_once(self.timed.fn, device))
            if not seen_violation(seen[-1:], new[-1:]):  # this pair clears the key
                return [], []
        return seen, new

    def _note(self, problem: str) -> None:
        if problem and problem not in self.problems:
            self.problems.append(problem)


def _kept(caches: CallCaches | None, timing: TimingCall) -> dict[str, torch.Tensor] | None:
    """This process's kept answers of the verdict's call the phase makes, by quantity ({} when none); None when the
    round names no verified answer: a worker's round, whose answers are all judged in the run's process."""
    if not timing.verified:
        return None
    if caches is None or timing.verified not in caches.answers:
        return {}
    call = timed_call(timing.phase)
    return {quantity: t for (kind, quantity), t in caches.answers.get(timing.verified).items() if kind == call}


def _drop_scaled(observed: list[Observed], kept: dict[str, torch.Tensor]) -> None:
    """Drop each answer that is the kept verified one or the last call's, scaled, bit for bit (scaled_*)."""
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


def fidelity_of(backend: Backend, device: torch.device, case, seed: int):
    """The forward of `backend` on `case` timed by the harness and an independent timer (measure.fidelity)."""
    from harness.measure.fidelity import fidelity

    call = BoundCall(backend, case, device)
    q, k, v, _ = backend_inputs(backend, case, call_inputs(Call(case, seed), device), requires_grad=False)
    with device_scope(device), torch.no_grad(), stage("fidelity"):
        return fidelity(lambda: call(q, k, v), device)
