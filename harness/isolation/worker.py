"""A worker process: one backend on the device, serving the supervisor's requests until stopped or orphaned."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import torch

from harness.backends.base import Backend
from harness.calls.device import indexed
from harness.isolation.brackets import Ticker
from harness.isolation.child import child_channel, serve
from harness.calls.outcome import Failure
from harness.isolation.wire import WorkerSpec
from harness.measure.stages import STAGE_CLOCK, stage


def _redirect_output(log_dir: str | None, name: str) -> None:
    """This process's stdout and stderr file descriptors (C++ output too) to a log file."""
    if log_dir is None:
        return
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    fd = os.open(str(Path(log_dir) / f"{name}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _progress_lock_of_its_own() -> None:
    """tqdm's default lock holds a process-shared semaphore, registered with the run's resource tracker; a worker
    that dies by a signal (compiled flex on an empty sequence: SIGFPE) cannot unregister it, and the run then ends
    with "resource_tracker: ... leaked semaphore objects". A worker's progress bars (inductor draws them while it
    compiles, even disabled) are never shared with another process: a thread lock is all they need."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())


def _cuda_broken(device: torch.device) -> bool:
    """True when the CUDA context is unusable (a device-side assert, an illegal address: sticky errors)."""
    try:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return False
    except Exception:
        return True


def worker_main(conn, clock_conn, spec: WorkerSpec, backend_name: str) -> None:
    channel = child_channel(conn)
    _redirect_output(spec.log_dir, backend_name)
    _progress_lock_of_its_own()
    from harness.backends.registry import all_backends, import_backend_module
    from harness.calls.cache import CallCaches
    from harness.calls.call import run_call
    from harness.calls.caller import allow_backward_replay
    from harness.calls.timed import run_timing

    try:
        device = indexed(torch.device(spec.device))
        torch.set_num_threads(spec.threads)
        allow_backward_replay()
        if device.type == "cuda":
            torch.cuda.set_device(device)  # events, streams and graphs follow the current device
        for module in spec.modules:  # only the module that registered this backend (supervisor.Worker)
            import_backend_module(module)
        registry = all_backends()
        if backend_name not in registry:
            raise ValueError(f"backend {backend_name!r} is not registered in the worker (is its module importable?)")
        backend: Backend = registry[backend_name]
    except BaseException as exc:  # noqa: B036
        channel.send(("failed", Failure.of(exc)))
        return
    channel.send(("ready", None))
    ticker = Ticker(clock_conn)  # the run brackets each timed call on this pipe (brackets.py)
    caches = CallCaches()  # the worker's own: a call and the timing rounds of its case share the seeded inputs,
                           # and timing finds the correctness call's answers there
    serving = {"available": lambda _: backend.unavailable_reason(device),
               "call": lambda call: run_call(backend, call, device, caches),
               "time": lambda timing: run_timing(backend, timing, device, caches, ticker),
               "run": lambda task: task[0](backend, device, *task[1])}
    broken = []

    def answer(kind: str, payload):
        before = STAGE_CLOCK.snapshot()
        try:
            with stage(f"worker: {kind}"):  # what the request's nested stages do not cover
                reply = ("ok", serving[kind](payload))
        except BaseException as exc:  # noqa: B036
            reply = ("failed", Failure.of(exc))
        broken[:] = [_cuda_broken(device)]
        return (*reply, STAGE_CLOCK.since(before))  # the time the request took here, for the run's stage clock

    def after() -> None:
        if broken[0]:
            os._exit(3)  # the supervisor sees the exit and starts a fresh worker for the next call

    serve(channel, answer, after)
