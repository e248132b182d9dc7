"""One timing round of one phase as data, run next to the kernel (here or in its worker): memory, samples, compile."""

from __future__ import annotations

import functools
import secrets
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from harness.backends.base import Backend
from harness.execution.cache import CallCaches
from harness.execution.call import (BoundCall, Call, backend_inputs, call_inputs, device_scope, modifier_leaves,
                                    poison)
from harness.execution.integrity import CallContent, RoundInputs, Snapshot, Transform, aliased, same_bits
from harness.execution.outcome import Failure, free
from harness.measure.cuda_graph import Captured
from harness.measure.memory import peak_memory
from harness.measure.stages import stage
from harness.measure import timing as clocks  # clocks.CLOCKS, read where used: one binding for every reading
from harness.measure.timing import Measurement, TimingConfig, measure
from harness.spec.case import Inputs
from harness.spec.modifiers import MODIFIER_GRADS
from harness.store.schema import BWD, FWD, FWD_BWD, GRADS, OOM


#: besides a round's last two calls, each other timed call is judged with odds 1/CHECK_ONE_IN: a kernel wrong on m
#: calls of a round, none of them the last two, escapes with odds (1 - 1/CHECK_ONE_IN)^m (m = 10: 5.6 %, m = 20: 0.3 %)
CHECK_ONE_IN = 4


@dataclass(frozen=True)
class TimingCall:
    """Time `phase` of the call's case; estimate_ms, known_memory (bytes, method) from earlier rounds (None: measure
    now); inputs: the round's transforms (None: nothing observed)."""

    call: Call
    phase: str
    config: TimingConfig
    estimate_ms: float | None = None
    known_memory: tuple[int, str] | None = None
    cpu_mem_budget: int | None = None
    inputs: RoundInputs | None = None


@dataclass
class Observed:
    """What a timed call returned (CPU, canonical layout) and the transform its inputs were made with."""

    transform: Transform
    out: torch.Tensor | None = None
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    #: the call's own content on top of the transform (divided out where the calls ran: the answers here are the
    #: transform's)
    content: CallContent | None = None

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
    #: the round as the timing process's clocks account for it, ms: its work around `measure`, measure's own besides
    #: the samples, and the samples; and the round by the run's process's clock, around its request (None: not
    #: timed); integrity.clock_disagreement compares them
    accounted_ms: float | None = None
    wall_ms: float | None = None
    #: the timing process's clock as the round started, and the run's as it sent the request (ns; one system-wide
    #: monotonic clock): a round cannot start before it was asked for, so a clock left behind shows here
    started_ns: int | None = None
    asked_ns: int | None = None

    @property
    def interrupted(self) -> bool:
        return self.failure is not None and self.failure.interrupted


@dataclass
class Phase:
    """What timing a phase runs: `setup` before every repetition (untimed), `fn` the timed call, `build` what fn
    reads made anew; buffers: the call's inputs by name; refill, renew, fresh, observe: docs/design/execution.md."""

    setup: Callable[[], None] | None
    fn: Callable[[], object]
    build: Callable[[], None] | None = None
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    renew: Callable[[Inputs], dict[str, torch.Tensor]] | None = None
    observe: Callable[[object], tuple[torch.Tensor | None, dict[str, torch.Tensor]]] | None = None
    refill: Callable[[Inputs], dict[str, torch.Tensor]] | None = None
    #: a call's own content written into the buffers (all four; the backward alone: dO, on the graph it has)
    fresh: Callable[[Inputs], dict[str, torch.Tensor]] | None = None


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

    def fresh_d_out(new: Inputs) -> dict[str, torch.Tensor]:
        source = backend.to_layout(new.d_out).detach()  # as backend_inputs lays dO out; q, k, v stay as built
        with torch.no_grad():
            d_out.copy_(source)
        return {"dO": source}

    def renew(new: Inputs) -> dict[str, torch.Tensor]:
        sources = refill(new)
        if built and {"q", "k", "v"} & set(copied):  # the backward alone on new q, k or v: a new forward (a graph
            build()                                  # of its own); a new dO alone runs on the graph already built
        return sources

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
        return Phase(None, inference, None, buffers, renew, observe, refill, refill)
    if phase == FWD_BWD:
        return Phase(reset, step, None, buffers, renew, observe, refill, refill)
    return Phase(reset, lambda: built[0].backward(d_out, retain_graph=True), build, buffers, renew, observe, refill,
                 fresh_d_out)


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
    start = clocks.CLOCKS.now_ns()
    result = TimingResult(started_ns=start)
    with device_scope(device):
        try:
            with stage("inputs"):
                verified = call_inputs(timing.call, device, None if caches is None else caches.drawn)
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
                        checks = None if plan is None else _Checks(backend, timed, verified, plan, case, phase)
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
                    checks = None if plan is None else _Checks(backend, timed, verified, plan, case, phase)
                captured = None
                if timing.config.cuda_graph and device.type == "cuda":
                    # the samples are replays: the checks renew, observe and confirm the graph, not an eager call
                    timed, captured = graph_phase(timed, device)
                    if checks is not None:
                        checks.timed = timed
                measure_start = clocks.CLOCKS.now_ns()
                result.measurement = measure(timed.fn, device=device, setup=timed.setup, config=timing.config,
                                             estimate_ms=timing.estimate_ms,
                                             build=None if first_done else timed.build, first_done=first_done,
                                             renew=None if checks is None else checks.renew,
                                             observe=None if checks is None else checks.observe, graph=captured,
                                             fresh=None if checks is None else checks.fresh)
                measure_ns = clocks.CLOCKS.now_ns() - measure_start
            result.compile_ms = backend.compile_time_ms()
            if checks is not None:
                with stage("integrity"):
                    result.observed, result.integrity = checks.finish(device)
            # what the round accounts for: a clock that read any part short shows as time nobody accounted for
            m = result.measurement
            outside_ms = (clocks.CLOCKS.now_ns() - start - measure_ns) / 1e6
            result.accounted_ms = outside_ms + m.untimed_ms + sum(m.samples_ms)
        except BaseException as exc:  # noqa: B036 - a backend's SystemExit or KeyboardInterrupt is this round's row
            failure = Failure.of(exc)
            result.failure = Failure(failure.status, f"during timing: {failure.reason}", failure.interrupted)
            free(device)
    return result


class _Checks:
    """A round's integrity checks where the calls run: fresh content every call, inputs left as given, outputs owned."""

    def __init__(self, backend: Backend, timed: Phase, verified: Inputs, plan: RoundInputs, case, phase: str):
        self.backend, self.timed, self.verified, self.plan = backend, timed, verified, plan
        self.snapshot = Snapshot(timed.buffers)
        self.problems: list[str] = []
        self.observed: list[Observed] = []
        self.base = plan.seen.inputs(verified)  # the round's inputs, each call's content drawn on top
        self.case, self.group = case, case.heads // case.kv_heads
        self.draw = functools.partial(CallContent.draw, case, backward_alone=phase == BWD,
                                      uniform=verified.sinks is not None or verified.bias is not None)
        # drawn where the calls run, from a seed no code saw: a kernel cannot know a call's content before it
        self.generator = torch.Generator().manual_seed(secrets.randbits(63))
        self.content: CallContent | None = None

    def fresh(self) -> None:
        """Before every call: content no earlier call had, written into its buffers (integrity.CallContent)."""
        self.content = self.draw(self.generator)
        self.snapshot = self.snapshot.rebased(self.timed.fresh(self.content.inputs(self.base)))

    def renew(self) -> None:
        """Before the last repetition: what the seen calls wrote, then the new inputs into the same buffers."""
        self._note(self.snapshot.written())
        self.base = self.plan.new.inputs(self.verified)
        copied_from = self.timed.renew(self.base)
        self.snapshot = Snapshot(self.timed.buffers, copied_from)

    def observe(self, value, last: int) -> None:
        """After every timed call: the last two, and each other one with odds 1/CHECK_ONE_IN drawn only now, are
        copied to be judged (a kernel cannot know which before it returns)."""
        if not last and secrets.randbelow(CHECK_ONE_IN):
            return
        if last == 1:
            self._note(aliased(value, self.timed.buffers))
        out, grads = self.timed.observe(value)
        self.observed.append(Observed(self.plan.new if last == 1 else self.plan.seen, out, grads, self.content))

    def finish(self, device: torch.device) -> tuple[list[Observed], str]:
        """(what was observed, CPU, canonical layout; the integrity problems, '' when none)."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self._note(self.snapshot.written())
        for o in self.observed:
            undo = (lambda q, t: t) if o.content is None else functools.partial(o.content.undo, group=self.group)
            o.out = None if o.out is None else undo("out", self.backend.from_layout(o.out).cpu())
            o.grads = {n: undo(n, (self.backend.from_layout(g) if n in GRADS else g).cpu()) for n, g in o.grads.items()}
        return self.observed, "; ".join(self.problems)

    def _note(self, problem: str) -> None:
        if problem and problem not in self.problems:
            self.problems.append(problem)


def fidelity_of(backend: Backend, device: torch.device, case, seed: int):
    """The forward of `backend` on `case` timed by the harness and an independent timer (measure.fidelity)."""
    from harness.measure.fidelity import fidelity

    call = BoundCall(backend, case, device)
    q, k, v, _ = backend_inputs(backend, case, call_inputs(Call(case, seed), device), requires_grad=False)
    with device_scope(device), torch.no_grad(), stage("fidelity"):
        return fidelity(lambda: call(q, k, v), device)
