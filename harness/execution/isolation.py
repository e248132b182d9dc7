"""Backends in supervised worker processes: a crash, a fatal CUDA error or a hang of one call becomes that call's
row, the worker is restarted, and the sweep goes on.

One persistent worker per backend (its compile caches and CUDA context are paid for once). The worker draws the
case's inputs itself from (case, seed), runs the call and the timing next to the kernel - so latencies are the
same as in-process - and sends outputs back as CPU tensors through shared memory (torch's multiprocessing
reductions). The supervisor waits on the reply and on the process itself, as pytest-xdist's and
pytest-timeout's do: a worker that dies (a signal, os._exit) or outlives the call's timeout is reported and
replaced. Workers ignore Ctrl-C, which is the run's to handle, and their stdout/stderr (library noise) go to a
log file under the run directory rather than the terminal.
"""

from __future__ import annotations

import atexit
import fnmatch
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import sys
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any, Callable

import torch
import torch.multiprocessing  # noqa: F401 - registers tensor reductions: large CPU tensors travel in shared memory

from harness.backends.base import Backend
from harness.backends.registry import loaded_modules
from harness.execution.call import Call, CallResult
from harness.execution.device import indexed
from harness.execution.executor import CallFailed, Executor
from harness.execution.outcome import Failure
from harness.execution.timed import TimingCall, TimingResult
from harness.measure.stages import CLOCK, stage
from harness.store.schema import ERROR, UNAVAILABLE

#: seconds a call may run before its worker is killed (--call-timeout-s): generous, a first compile can take minutes
DEFAULT_TIMEOUT_S = 300.0
#: seconds a worker may take to start (import torch, the backend and plugin modules)
START_TIMEOUT_S = 180.0
#: what the forkserver imports once, so that every worker forked from it starts with it
FORKSERVER_PRELOAD = ("harness.execution.isolation",)


def timeouts(values: list[tuple[str, float]]) -> tuple[float, tuple[tuple[str, float], ...]]:
    """(default seconds, (pattern, seconds) overrides) from the --call-timeout-s values (cli.options.call_timeout
    parses each), last one winning."""
    default = next((s for p, s in reversed(values) if p == "*"), DEFAULT_TIMEOUT_S)
    return default, tuple((p, s) for p, s in reversed(values) if p != "*")


#: tensors up to this size travel as bytes in the message: below it, copying is cheaper than a shared-memory
#: segment and the file descriptor handed over for it. Measured here (benchmarks/worker_transfer.py, four tensors
#: a call): 64 KiB each 1.2 ms inline against 3.8 ms; 256 KiB 7.3 against 5.6; 1 MiB 32 against 8.5; 8 MiB 209
#: against 37 (an earlier threshold of 16 MiB came from one 1 MB figure)
INLINE_BYTES = 128 * 2 ** 10


def _tensor_from_bytes(dtype: torch.dtype, shape: tuple[int, ...], data: bytes) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


class _Pickler(ForkingPickler):
    """torch's multiprocessing pickler, with small CPU tensors copied into the message."""

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and obj.layout == torch.strided \
                and not obj.requires_grad and obj.nbytes <= INLINE_BYTES:
            data = obj.detach().contiguous().view(torch.uint8).numpy().tobytes() if obj.numel() else b""
            return _tensor_from_bytes, (obj.dtype, tuple(obj.shape), data)
        return NotImplemented


def _send(conn, obj: Any) -> None:
    conn.send_bytes(bytes(_Pickler.dumps(obj)))


def _recv(conn) -> Any:
    return pickle.loads(conn.recv_bytes())


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker of a run needs: the device, plugin modules to import, CPU threads, where its output goes."""

    device: str
    modules: tuple[str, ...] = ()
    threads: int = 1
    log_dir: str | None = None


def _redirect_output(log_dir: str | None, name: str) -> None:
    """Send this process's stdout and stderr (file descriptors, so C++ and library output too) to a log file."""
    if log_dir is None:
        return
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    fd = os.open(str(Path(log_dir) / f"{name}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _cuda_broken(device: torch.device) -> bool:
    """True when the CUDA context is unusable (a device-side assert, an illegal address): errors that stick to
    the process, so every later call in it would fail too."""
    if device.type != "cuda":
        return False
    try:
        torch.cuda.synchronize(device)
        return False
    except Exception:
        return True


def worker_main(conn, spec: WorkerSpec, backend_name: str) -> None:
    """A worker's life: set up, say ready (or why not), then serve requests until told to stop or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the run's to handle; a worker finishes its call
    _redirect_output(spec.log_dir, backend_name)
    from harness.backends.registry import all_backends, load_backend_module
    from harness.execution.cache import DRAWN_INPUTS, LRU
    from harness.execution.call import run_call
    from harness.execution.timed import allow_backward_replay, run_timing

    try:
        device = indexed(torch.device(spec.device))
        torch.set_num_threads(spec.threads)
        allow_backward_replay()
        if device.type == "cuda":
            torch.cuda.set_device(device)  # events, streams and graphs follow the current device
        for module in spec.modules:
            load_backend_module(module)
        registry = all_backends()
        if backend_name not in registry:
            raise ValueError(f"backend {backend_name!r} is not registered in the worker (is its module importable?)")
        backend: Backend = registry[backend_name]
    except BaseException as exc:  # noqa: B036
        _send(conn, ("failed", Failure.of(exc)))
        return
    _send(conn, ("ready", None))
    drawn = LRU(DRAWN_INPUTS)  # the worker's own: a call and the timing rounds of its case share the seeded inputs
    while True:
        try:
            kind, payload = _recv(conn)
        except (EOFError, OSError):  # the supervisor is gone
            return
        if kind == "stop":
            return
        before = CLOCK.snapshot()
        try:
            with stage(f"worker: {kind}"):  # what the request's nested stages do not cover
                if kind == "available":
                    reply = ("ok", backend.unavailable_reason(device))
                elif kind == "call":
                    reply = ("ok", run_call(backend, payload, device, drawn))
                elif kind == "time":
                    reply = ("ok", run_timing(backend, payload, device, drawn))
                else:
                    fn, args = payload
                    reply = ("ok", fn(backend, device, *args))
        except BaseException as exc:  # noqa: B036
            reply = ("failed", Failure.of(exc))
        broken = _cuda_broken(device)
        _send(conn, (*reply, CLOCK.since(before)))  # the time the request took here, for the run's stage clock
        del reply
        if broken:
            os._exit(3)  # the supervisor sees the exit and starts a fresh worker for the next call


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

    def __init__(self, name: str, spec: WorkerSpec, ctx):
        self.name, self.spec = name, spec
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=worker_main, args=(child, spec, name), name=f"harness-worker-{name}",
                                   daemon=True)
        self.process.start()
        child.close()
        self.start_failure: Failure | None = None
        reply = self._receive(START_TIMEOUT_S, "starting")
        if reply[0] != "ready":
            self.start_failure = reply[1]
            self.kill()

    @property
    def alive(self) -> bool:
        return self.start_failure is None and self.process.is_alive()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=10)
        self.conn.close()

    def stop(self) -> None:
        try:
            _send(self.conn, ("stop", None))
            self.process.join(timeout=5)
        except (OSError, ValueError):
            pass
        self.kill()

    def _receive(self, timeout: float, doing: str) -> tuple[str, Any]:
        ready = mp.connection.wait([self.conn, self.process.sentinel], timeout)
        if self.conn in ready:
            try:
                return _recv(self.conn)
            except (EOFError, OSError):
                pass
        elif not ready:
            self.kill()
            return "failed", Failure(ERROR, f"timed out after {timeout:g} s while {doing} (--call-timeout-s); "
                                              "the worker was killed and is restarted for the next call")
        self.process.join(timeout=5)
        return "failed", Failure(ERROR, f"{_death(self.process)} while {doing}; restarted for the next call")

    def ask(self, kind: str, payload: Any, timeout: float, doing: str) -> tuple[str, Any]:
        """Send a request and wait for (status, answer); the worker's own stage times join this process's clock,
        and "worker pipe" is left with the rest: pickling, shared memory, the pipe."""
        with stage("worker pipe"):
            try:
                _send(self.conn, (kind, payload))
            except (OSError, ValueError):  # died before this request
                self.process.join(timeout=5)
                return "failed", Failure(ERROR, f"{_death(self.process)} before {doing}")
            reply = self._receive(timeout, doing)
            if len(reply) == 3:  # a worker's reply; one made up here has no times
                CLOCK.merge(reply[2])
        return reply[0], reply[1]


@dataclass
class IsolatedExecutor(Executor):
    """Runs each backend's calls in its own supervised worker on `device` (see the module docstring).

    timeouts: (case id pattern, seconds) overrides of `timeout_s`, first match wins (fnmatch patterns).
    """

    device: torch.device
    #: plugin modules each worker loads (default: those loaded in this process so far)
    modules: tuple[str, ...] = field(default_factory=loaded_modules)
    threads: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    timeouts: tuple[tuple[str, float], ...] = ()
    log_dir: str | None = None
    workers: dict[str, Worker] = field(default_factory=dict)
    _available: dict[str, str | None] = field(default_factory=dict)
    #: how many workers were replaced after dying or timing out, per backend
    restarts: dict[str, int] = field(default_factory=dict)

    isolated = True

    def __post_init__(self):
        self.device = indexed(torch.device(self.device))
        self._ctx = mp.get_context("forkserver")
        self._ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
        self._spec = WorkerSpec(str(self.device), tuple(self.modules), self.threads or torch.get_num_threads(),
                                self.log_dir)
        atexit.register(self.close)

    def timeout_for(self, case_id: str) -> float:
        return next((s for pattern, s in self.timeouts if fnmatch.fnmatchcase(case_id, pattern)), self.timeout_s)

    def _worker(self, backend: Backend) -> Worker:
        worker = self.workers.get(backend.name)
        if worker is not None and worker.start_failure is not None:
            return worker  # it could not start: every call says why
        if worker is None or not worker.alive:
            if worker is not None:
                worker.kill()
                self.restarts[backend.name] = self.restarts.get(backend.name, 0) + 1
            with stage("worker start"):
                worker = self.workers[backend.name] = Worker(backend.name, self._spec, self._ctx)
        return worker

    def _ask(self, backend: Backend, kind: str, payload: Any, timeout: float, doing: str) -> tuple[str, Any]:
        worker = self._worker(backend)
        if worker.start_failure is not None:
            return "failed", Failure(worker.start_failure.status,
                                     f"the worker of {backend.name} could not start: {worker.start_failure.reason}")
        return worker.ask(kind, payload, timeout, doing)

    def unavailable_reason(self, backend: Backend, device: torch.device) -> str | None:
        self._check(device)
        if backend.name not in self._available:
            status, answer = self._ask(backend, "available", None, START_TIMEOUT_S, "checking availability")
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
        self._check(device)
        status, answer = self._ask(backend, "call", call.to_cpu(), self.timeout_for(call.case.id),
                                   f"running {backend.name} on {call.case.id}")
        return self._noted(answer if status == "ok" else CallResult(failure=answer), backend)

    def time(self, backend: Backend, timing: TimingCall, device: torch.device) -> TimingResult:
        self._check(device)
        from dataclasses import replace

        timing = replace(timing, call=timing.call.to_cpu())
        status, answer = self._ask(backend, "time", timing, self.timeout_for(timing.call.case.id),
                                   f"timing {backend.name} {timing.phase} on {timing.call.case.id}")
        if status == "ok":
            return self._noted(answer, backend)
        return TimingResult(failure=Failure(answer.status, f"during timing: {answer.reason}", answer.interrupted))

    def run(self, backend: Backend, fn: Callable[..., Any], device: torch.device, *args: Any) -> Any:
        self._check(device)
        status, answer = self._ask(backend, "run", (fn, args), self.timeout_s,
                                   f"running {getattr(fn, '__name__', 'a task')} for {backend.name}")
        if status != "ok":
            if answer.interrupted:
                self._note_interrupt(backend)
            raise CallFailed(answer)
        return answer

    def worker_restarts(self) -> dict[str, int]:
        return dict(self.restarts)

    def _check(self, device: torch.device) -> None:
        if indexed(torch.device(device)) != self.device:
            raise ValueError(f"this executor's workers run on {self.device}; asked for {device}")

    def close(self) -> None:
        for worker in self.workers.values():
            worker.stop()
        self.workers.clear()
