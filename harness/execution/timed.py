"""One timing round of one phase, described as data so it runs where the backend runs (here or in its worker):
peak memory, the repetitions, the compile time. Timing stays next to the kernel, so isolation costs no latency."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from harness.backends.base import Backend
from harness.execution.cache import LRU
from harness.execution.call import BoundCall, Call, backend_inputs, call_inputs, device_scope, modifier_leaves
from harness.execution.outcome import Failure, free
from harness.measure.memory import CPU_METHOD, first_call_peak, peak_memory
from harness.measure.stages import stage
from harness.measure.timing import Measurement, TimingConfig, measure
from harness.store.schema import FWD, FWD_BWD, OOM


@dataclass(frozen=True)
class TimingCall:
    """Time `phase` of the call's case: estimate_ms from earlier rounds (None: estimate now); known_memory (bytes,
    method) from an earlier round (None: measure it); over cpu_mem_budget bytes of peak memory on the CPU is oom."""

    call: Call
    phase: str
    config: TimingConfig
    estimate_ms: float | None = None
    known_memory: tuple[int, str] | None = None
    cpu_mem_budget: int | None = None


@dataclass
class TimingResult:
    measurement: Measurement | None = None
    peak_mem_bytes: int | None = None
    mem_method: str | None = None
    failure: Failure | None = None
    compile_ms: float | None = None

    @property
    def interrupted(self) -> bool:
        return self.failure is not None and self.failure.interrupted


@dataclass
class Phase:
    """What timing a phase runs: `setup` before every repetition (outside the timed region), `fn` the timed call,
    and `build`, run once before any of it - on the capture stream when timed as a CUDA graph."""

    setup: Callable[[], None] | None
    fn: Callable[[], object]
    build: Callable[[], None] | None = None


def phase_callables(backend: Backend, case, inputs, device: torch.device, phase: str) -> Phase:
    """The Phase of fwd (inference, no autograd), bwd (the backward alone, on a retained graph, with the shared
    dO) or fwd+bwd (one training step). Gradients are reset in setup; the backend's `prepare` runs here, once."""
    q, k, v, d_out = backend_inputs(backend, case, inputs, requires_grad=phase != FWD)
    leaves = modifier_leaves(inputs, requires_grad=phase != FWD)  # sinks/bias: their gradients are work too
    call = BoundCall(backend, case, device, leaves=leaves)

    def forward():
        return call(q, k, v)

    def reset():
        for t in (q, k, v, *leaves.values()):
            t.grad = None

    if phase == FWD:
        def inference():  # as the correctness call runs it: a compiled backend guarded on grad mode compiles once
            with torch.no_grad():
                return forward()
        return Phase(None, inference)
    if phase == FWD_BWD:
        return Phase(reset, lambda: forward().backward(d_out))
    built: list = []

    def build():  # the forward, made once; retain_graph lets every repetition run the same backward alone
        if not built:
            built.append(forward())

    return Phase(reset, lambda: built[0].backward(d_out, retain_graph=True), build)


def allow_backward_replay() -> None:
    """Let a compiled backend's backward run again on the same graph, as the bwd phase does (retain_graph=True).

    AOTAutograd donates the forward's saved buffers to the backward by default and then refuses retain_graph:
    seen on an H200 (torch 2.11), flex's every bwd row was "This backward function was compiled with non-empty
    donated buffers which requires create_graph=False and retain_graph=False". Only graphs compiled after this
    call are affected, so a process calls it before any backend runs (the run's session, each worker)."""
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, "donated_buffer"):  # torch >= 2.5
        functorch_config.donated_buffer = False


def run_timing(backend: Backend, timing: TimingCall, device: torch.device, drawn: LRU | None = None) -> TimingResult:
    """Measure one round; every failure (raised, oom, over the CPU budget) comes back as a Failure. Seeded inputs
    are drawn through `drawn` (call_inputs)."""
    result = TimingResult()
    with device_scope(device):
        try:
            with stage("inputs"):
                inputs = call_inputs(timing.call, device, drawn)
            case, phase = timing.call.case, timing.phase
            # On the CPU the round's first call (kept apart from the samples) is also its memory probe, and its
            # time is handed to measure; elsewhere, or when the latency is already known (no first call), the probe
            # is a call of its own.
            timed, first_ms = None, None
            if timing.known_memory is not None:
                result.peak_mem_bytes, result.mem_method = timing.known_memory
            elif device.type == "cpu" and timing.estimate_ms is None:
                with stage("timing"):
                    timed = phase_callables(backend, case, inputs, device, phase)
                with stage("peak memory"):
                    if timed.build is not None:
                        timed.build()  # made once: measure's build() below finds it made
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
                timed = timed or phase_callables(backend, case, inputs, device, phase)
                result.measurement = measure(timed.fn, device=device, setup=timed.setup, config=timing.config,
                                             estimate_ms=timing.estimate_ms, build=timed.build, first_ms=first_ms)
            result.compile_ms = backend.compile_time_ms()
        except BaseException as exc:  # noqa: B036 - a backend's SystemExit or KeyboardInterrupt is this round's row
            failure = Failure.of(exc)
            result.failure = Failure(failure.status, f"during timing: {failure.reason}", failure.interrupted)
            free(device)
    return result


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
