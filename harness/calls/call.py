"""One backend call as data (run here or in a worker) and what it returned; `run_call` is its one runner."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from harness.backends.base import Backend
from harness.calls.bound import Arrangement, BoundCall, backend_inputs, modifier_leaves
from harness.calls.cache import LRU, CallCaches, cached
from harness.calls.contract import Snapshot, grad_violation, owned
from harness.calls.outcome import Failure
from harness.measure.stages import stage
from harness.cases.case import AttentionCase, Inputs, make_inputs
from harness.cases.modifiers import MODIFIER_GRADS
from harness.store.schema import FAIL, GRADS


@dataclass(frozen=True)
class Call:
    """One call of a backend on `case`, as data (it may run in a worker process).

    seed: the inputs are make_inputs(case, device, seed); `inputs` then only saves drawing them here, and a worker
    draws its own. seed=None: `inputs` are the call's own and travel with it. entry: 'forward' or a native probe,
    whose arguments are mask (native_mask) and p (native_dropout); rng_seed seeds torch's RNG for the call alone.
    """

    case: AttentionCase
    seed: int | None = 0
    inputs: Inputs | None = None
    entry: str = "forward"
    backward: bool = False
    arrangement: Arrangement | None = None
    mask: torch.Tensor | None = None
    p: float = 0.0
    rng_seed: int | None = None
    #: with backward: run a call without autograd first (what inference and fwd timing run), its output judged too
    inference: bool = False

    def __post_init__(self):
        if self.seed is None and self.inputs is None:
            raise ValueError("a Call needs a seed to draw its inputs from, or the inputs themselves")

    def to_cpu(self) -> "Call":
        """The call as it crosses to a worker: seeded inputs dropped, its own inputs and mask on the CPU."""
        inputs = None if self.inputs is None or self.seed is not None else self.inputs.map(lambda t: t.detach().cpu())
        mask = None if self.mask is None else self.mask.cpu()
        return replace(self, inputs=inputs, mask=mask)


@dataclass
class CallResult:
    """What a call returned, canonical layout, on the device it ran on (a CPU, or the GPU whose answers cross to the
    run by CUDA IPC): the output and gradients, or why there is none."""

    out: torch.Tensor | None = None
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    failure: Failure | None = None
    backward_failure: Failure | None = None
    #: the kernels that ran, named where the call ran (BoundCall.ops), and the compile time of a compiling backend
    op: str = ""
    backward_op: str = ""
    compile_ms: float | None = None
    #: the output of the call without autograd (Call.inference)
    inference_out: torch.Tensor | None = None

    @property
    def interrupted(self) -> bool:
        return any(f is not None and f.interrupted for f in (self.failure, self.backward_failure))


def call_inputs(call: Call, device: torch.device, drawn: LRU | None = None) -> Inputs:
    """The call's inputs on `device`: given ones moved there, or the seeded ones drawn (kept in `drawn`)."""
    if call.inputs is not None:
        return call.inputs.map(lambda t: t.to(device))
    return cached(drawn, (call.case, call.seed, str(device)), lambda: make_inputs(call.case, device, call.seed))


def device_scope(device: torch.device):
    """`device` as the current CUDA device (events, streams and graphs follow it, not the tensors'); CPU: no-op."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _answer(t: torch.Tensor) -> torch.Tensor:
    """A copy taken now, where the call ran (`.cpu()` would alias a CPU tensor a background thread may still be
    writing): a GPU answer stays on the device and crosses to the run by CUDA IPC (isolation/wire.py), to be judged
    there (oracle/placement.py); a CPU one on the CPU."""
    t = t.detach()
    return t.clone() if t.is_cuda else t.to("cpu", copy=True)


def leaf_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               leaves: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(gradient, leaf) by the gradient's name (dq, dk, dv, dsinks, dbias): zeros where the call wrote none."""
    return {name: (leaf.grad if leaf.grad is not None else torch.zeros_like(leaf), leaf)
            for name, leaf in [*zip(GRADS, (q, k, v)), *((MODIFIER_GRADS[n], t) for n, t in leaves.items())]}


def poison(out: torch.Tensor) -> None:
    """NaN into a judged output, so the next call's `empty` output cannot find it (KernelBench's result reuse)."""
    if out.is_floating_point():
        with torch.no_grad():
            out.detach().fill_(float("nan"))


def _entry(backend: Backend, call: Call, device: torch.device,
           leaves: dict[str, torch.Tensor]) -> tuple[Callable, tuple[str, str]]:
    """The prepared (q, k, v) -> out of the call's entry and its (forward, backward) kernel names."""
    scale = call.case.scale
    if call.entry == "forward":
        bound = BoundCall(backend, call.case, device, call.arrangement, leaves)
        return bound, bound.ops(call.backward)
    names = (backend.name, backend.name)
    if call.entry == "native_causal":
        return (lambda q, k, v: backend.native_causal(q, k, v, scale=scale)), names
    if call.entry == "native_mask":
        mask = call.mask.to(device)
        return (lambda q, k, v: backend.native_mask(q, k, v, mask=mask, scale=scale)), names
    return (lambda q, k, v: backend.native_dropout(q, k, v, p=call.p, scale=scale)), names


def run_call(backend: Backend, call: Call, device: torch.device, caches: CallCaches | None = None) -> CallResult:
    """The call's outputs (canonical layout, where it ran) or its failure; never raises for anything the backend
    does."""
    drawn = None if caches is None else caches.drawn
    with device_scope(device), _seeded(call.rng_seed, device):
        result = CallResult()
        try:
            with stage("inputs"):
                inputs = call_inputs(call, device, drawn)
                q, k, v, d_out = backend_inputs(backend, call.case, inputs, requires_grad=call.backward)
                leaves = modifier_leaves(inputs, requires_grad=call.backward)
            with stage("prepare"):
                fn, (op, backward_op) = _entry(backend, call, device, leaves)
            given = {"q": q, "k": k, "v": v, "dO": d_out, **leaves}
            snapshot = Snapshot(given)  # a call must leave its inputs as given: they are the caller's
            if call.inference and call.backward:  # the call inference and fwd timing make, judged by itself
                with torch.no_grad(), stage("forward"):
                    inference = fn(q, k, v)
                result.failure = owned("[fwd, no-grad] ", inference, q, v, given, snapshot, call.case.dtype)
                if result.failure is not None:
                    result.op = op
                    return result
                with stage("answers copied"):
                    result.inference_out = _answer(backend.from_layout(inference.detach()))
                poison(inference)
                del inference
            grad_mode = contextlib.nullcontext() if call.backward else torch.no_grad()
            with grad_mode, stage("forward"):  # a compiling backend's first call includes its compile
                out = fn(q, k, v)
        except BaseException as exc:  # noqa: B036 - SystemExit/KeyboardInterrupt from a backend become rows
            result.failure = Failure.of(exc)
            return result
        result.op, result.compile_ms = op, backend.compile_time_ms()
        path = "[fwd, grad] " if call.inference and call.backward else ""
        result.failure = owned(path, out, q, v, given, snapshot, call.case.dtype)
        if result.failure is not None:
            return result
        with stage("answers copied"):
            result.out = _answer(backend.from_layout(out.detach()))
        if not call.backward:
            return result
        try:
            with stage("backward"):
                out.backward(d_out)
        except BaseException as exc:  # noqa: B036
            result.backward_failure = Failure.of(exc)
            return result
        result.backward_op = backward_op
        if written := snapshot.written():
            result.backward_failure = Failure(FAIL, f"[bwd] {written}")
            return result
        problems = []
        for name, (grad, leaf) in leaf_grads(q, k, v, leaves).items():
            if problem := grad_violation(name, grad, leaf):
                problems.append(problem)
            else:
                with stage("answers copied"):  # sinks and bias are canonical in every layout
                    result.grads[name] = _answer(backend.from_layout(grad) if name in GRADS else grad)
        if problems:
            result.backward_failure = Failure(FAIL, "; ".join(problems))
        return result


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device):
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        yield
