"""The isolated Executor: each backend in a supervised worker process of its own, replaced when it dies or hangs."""

from __future__ import annotations

import fnmatch
import signal
import weakref
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, Callable

import torch

from harness.backends.base import Backend
from harness.backends.registry import modules_for
from harness.calls.call import Call, CallResult
from harness.isolation.child import REFUSED, START_TIMEOUT_S, TIMED_OUT, Child, Gone
from harness.calls.device import indexed
from harness.isolation.neighbours import EqualMachine, Placement
from harness.calls.outcome import CallFailed, Failure, InterruptNoted
from harness.isolation.plugin_host import host_pids
from harness.calls.round import JUDGED_DRAWS
from harness.calls.timed import TimingCall, TimingResult
from harness.isolation.wire import WorkerSpec
from harness.isolation.worker import worker_main
from harness.measure.stages import STAGE_CLOCK, stage
from harness.measure.timing import CLOCKS
from harness.store.schema import ERROR, UNAVAILABLE

#: seconds a call may run before its worker is killed (--call-timeout-s): generous, a first compile can take minutes
DEFAULT_TIMEOUT_S = 300.0
#: what env.json and the summary say of a run whose backends each ran in workers of their own
ISOLATED = "isolated: each backend's code only in its own worker processes"
def timeouts(values: list[tuple[str, float]]) -> tuple[float, tuple[tuple[str, float], ...]]:
    """(default seconds, (pattern, seconds) overrides) from the --call-timeout-s values, the last one winning."""
    default = next((s for p, s in reversed(values) if p == "*"), DEFAULT_TIMEOUT_S)
    return default, tuple((p, s) for p, s in reversed(values) if p != "*")


def _death(process) -> str:
    code = process.exitcode
    if code is None:
        return "the worker process stopped answering"
    if code < 0:
        try:
            return f"the worker process died (signal {signal.Signals(-code).name})"
        except ValueError:
            return f"the worker process died (signal {-code})"
    if code == 3:
        return "the worker process ended after a sticky CUDA error"
    return f"the worker process exited with status {code}"


class Worker:
    """One backend's process and the pipe to it."""

    def __init__(self, name: str, spec: WorkerSpec):
        """Start backend `name`'s worker: `spec.modules` None = the one plugin module that registered it."""
        if spec.modules is None:
            spec = replace(spec, modules=modules_for(name))
        self.name, self.spec = name, spec
        self.child = Child(worker_main, (spec, name), f"harness-worker-{name}", bracketed=JUDGED_DRAWS)
        self.process = self.child.process
        self.start_failure: Failure | None = None
        self.asked_ns: int | None = None
        self.asked_ms: float | None = None
        self.replied_ns: int | None = None
        reply = self._receive(START_TIMEOUT_S, "starting")
        if reply[0] != "ready":
            self.start_failure = reply[1]
            self.kill()

    def kill(self) -> None:
        self.child.kill()

    def stop(self) -> None:
        self.child.stop()

    def _receive(self, timeout: float, doing: str, request: Any = None) -> tuple[str, Any]:
        """The reply to `request` (None: the next message), its timed calls' brackets answered on the way."""
        try:
            return self.child.receive(timeout) if request is None else self.child.ask(request, timeout)
        except Gone as gone:
            if gone.why == REFUSED:
                return "failed", Failure(ERROR, f"{gone.text}; the worker was killed and is restarted for the next "
                                                "call")
            if gone.why == TIMED_OUT:
                return "failed", Failure(ERROR, f"timed out after {timeout:g} s while {doing} (--call-timeout-s); "
                                                "the worker was killed and is restarted for the next call")
            return "failed", Failure(ERROR, f"{_death(self.process)} while {doing}; restarted for the next call")
        finally:
            self.replied_ns = self.child.arrived_ns

    def ask(self, kind: str, payload: Any, timeout: float, doing: str, beside: bool = False) -> tuple[str, Any]:
        """Send a request and wait for (status, answer); beside=True: a worker beside the run (its times not merged).
        The run's clock as it asked and as the reply arrived is kept (`asked_ns`, `asked_ms`), for the clock audit:
        reading the reply is this process's work, never the worker's (large answers: a trip to its fd sharer each)."""
        self.asked_ns = self.replied_ns = CLOCKS.now_ns()
        try:
            return self._exchange(kind, payload, timeout, doing, beside)
        finally:
            self.asked_ms = (self.replied_ns - self.asked_ns) / 1e6

    def _exchange(self, kind: str, payload: Any, timeout: float, doing: str, beside: bool) -> tuple[str, Any]:
        with stage("worker pipe") if not beside else nullcontext():
            try:
                reply = self._receive(timeout, doing, (kind, payload))
            except (OSError, ValueError):  # died before this request
                self.process.join(timeout=5)
                return "failed", Failure(ERROR, f"{_death(self.process)} before {doing}")
            if len(reply) == 3 and not beside:  # a worker's reply; one made up here has no times
                STAGE_CLOCK.merge(reply[2])
        return reply[0], reply[1]


class IsolatedExecutor(InterruptNoted):
    """Each backend's calls in its own worker; timeouts: (fnmatch case id pattern, seconds), the first match wins."""

    isolated = True
    integrity = ISOLATED

    def __init__(self, device: torch.device | str, *, modules: tuple[str, ...] | None = None,
                 threads: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 timeouts: tuple[tuple[str, float], ...] = (), log_dir: str | None = None):
        self.device = indexed(torch.device(device))
        #: plugin modules every worker imports (None, the default: each backend's worker imports only the module
        #: that registered it, and a built-in's none - no backend's code in another's worker)
        self.modules = None if modules is None else tuple(modules)
        self.timeout_s, self.timeouts, self.log_dir = timeout_s, tuple(timeouts), log_dir
        self.workers: dict[str, Worker] = {}
        self.restarts: dict[str, int] = {}
        self._available: dict[str, str | None] = {}
        self._spec = WorkerSpec(str(self.device), self.modules, threads or torch.get_num_threads(), log_dir)
        #: where every timed worker's threads run: the run's own CPUs, nice value and policy (neighbours.py)
        self._placement = Placement.of_run()
        # closed with the run, or at exit: a finalizer that goes with the executor (no atexit entry per call)
        weakref.finalize(self, _stop_all, self.workers)

    def timeout_for(self, case_id: str) -> float:
        return next((s for pattern, s in self.timeouts if fnmatch.fnmatchcase(case_id, pattern)), self.timeout_s)

    def _ask(self, backend: Backend, device: torch.device, kind: str, payload: Any, timeout: float,
             doing: str, machine: list | None = None) -> tuple[str, Any]:
        """The worker's (status, answer); machine: a list that gets the request's EqualMachine - every other
        backend's process stopped while this one works, its placement set and checked (a timed round)."""
        self._check(device)
        worker = self.workers.get(backend.name)
        if worker is not None and worker.start_failure is None and not worker.process.is_alive():
            worker.kill()
            self.restarts[backend.name] = self.restarts.get(backend.name, 0) + 1
            worker = None
        if worker is None:
            with stage("worker start"):
                worker = self.workers[backend.name] = Worker(backend.name, self._spec)
        if worker.start_failure is not None:  # it could not start: every call says why
            return "failed", Failure(worker.start_failure.status,
                                     f"the worker of {backend.name} could not start: {worker.start_failure.reason}")
        if machine is None:
            return worker.ask(kind, payload, timeout, doing)
        others = [w.process.pid for w in self.workers.values() if w is not worker and w.process.is_alive()]
        with EqualMachine(worker.process.pid, others + host_pids(), self._placement, self._spec.threads) as equal:
            machine.append(equal)
            return worker.ask(kind, payload, timeout, doing)

    def unavailable_reason(self, backend: Backend, device: torch.device) -> str | None:
        self._check(device)
        if backend.name not in self._available:
            status, answer = self._ask(backend, device, "available", None, START_TIMEOUT_S, "checking availability")
            self._available[backend.name] = answer if status == "ok" else answer.reason
        return self._available[backend.name]

    def refusal(self, backend: Backend, device: torch.device) -> tuple[str, str] | None:
        reason = self.unavailable_reason(backend, device)
        if reason is None:
            return None
        worker = self.workers.get(backend.name)
        # a worker that could not start is the harness's failure, never the backend's absence
        return (ERROR if worker is not None and worker.start_failure is not None else UNAVAILABLE), reason

    def call(self, backend: Backend, call: Call, device: torch.device) -> CallResult:
        status, answer = self._ask(backend, device, "call", call.to_cpu(), self.timeout_for(call.case.id),
                                   f"running {backend.name} on {call.case.id}")
        return self._noted(answer if status == "ok" else CallResult(failure=answer), backend)

    def time(self, backend: Backend, timing: TimingCall, device: torch.device) -> TimingResult:
        # every timed answer comes back and is judged here (run/judge.py): nothing is compared where it ran
        timing, machine = replace(timing, call=timing.call.to_cpu()), []
        status, answer = self._ask(backend, device, "time", timing, self.timeout_for(timing.call.case.id),
                                   f"timing {backend.name} {timing.phase} on {timing.call.case.id}", machine)
        if status != "ok":
            return TimingResult(failure=Failure(answer.status, f"during timing: {answer.reason}", answer.interrupted))
        worker = self.workers[backend.name]  # the run's clock around the request, not the worker's
        answer.asked_ns, answer.wall_ms = worker.asked_ns, worker.asked_ms
        if device.type == "cpu":  # the run's own bracket of each call (on CUDA the events' audit stands)
            answer.witness = worker.child.brackets.witnessed(self._spec.threads)
        if machine:  # what the run's process saw of the machine while the worker was timed
            equal = machine[0]
            answer.others_share = equal.others_share
            answer.integrity = "; ".join(filter(None, (answer.integrity, equal.problem)))
        return self._noted(answer, backend)

    def run(self, backend: Backend, fn: Callable[..., Any], device: torch.device, *args: Any) -> Any:
        status, answer = self._ask(backend, device, "run", (fn, args), self.timeout_s,
                                   f"running {getattr(fn, '__name__', 'a task')} for {backend.name}")
        if status != "ok":
            raise CallFailed(self._noted(answer, backend))
        return answer

    def worker_restarts(self) -> dict[str, int]:
        return dict(self.restarts)

    def _check(self, device: torch.device) -> None:
        if indexed(torch.device(device)) != self.device:
            raise ValueError(f"this executor's workers run on {self.device}; asked for {device}")

    def close(self) -> None:
        _stop_all(self.workers)


def _stop_all(workers: dict[str, Worker]) -> None:
    for worker in workers.values():
        worker.stop()
    workers.clear()
