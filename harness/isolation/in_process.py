"""The in-process Executor (--no-isolate, the Python API's default): a backend's crash or hang is the run's, and
nothing guards the run from its code (a plugin declared from its own process still runs only in its workers)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness.backends.base import Backend
from harness.calls.cache import CallCaches
from harness.calls.call import Call, CallResult, run_call
from harness.calls.device import indexed
from harness.calls.outcome import CallFailed, Failure, InterruptNoted, exception_text
from harness.isolation.plugin_host import Declared
from harness.isolation.supervisor import IsolatedExecutor
from harness.calls.timed import TimingCall, TimingResult, run_timing
from harness.measure.timing import CLOCKS
from harness.store.schema import UNAVAILABLE

#: what env.json and the summary say of a run whose backends ran in the run's own process
UNGUARDED = "in-process, unguarded"


class InProcessExecutor(InterruptNoted):
    """Runs every backend call here, with caches and an interrupt note of its own; a plugin's stand-in (its module
    was loaded into a process of its own, never here) is handed to its workers."""

    isolated = False
    integrity = UNGUARDED

    def __init__(self):
        self.caches = CallCaches()
        self._workers: IsolatedExecutor | None = None

    def _elsewhere(self, backend: Backend, device: torch.device) -> IsolatedExecutor | None:
        """The workers of a declared plugin backend (its code never runs here), else None."""
        if not isinstance(backend, Declared):
            return None
        if self._workers is not None and self._workers.device != indexed(torch.device(device)):
            self._workers.close()
            self._workers = None
        if self._workers is None:
            self._workers = IsolatedExecutor(device)
        return self._workers

    def unavailable_reason(self, backend: Backend, device: torch.device) -> str | None:
        if (there := self._elsewhere(backend, device)) is not None:
            return there.unavailable_reason(backend, device)
        try:
            return backend.unavailable_reason(device)
        except Exception as exc:  # a broken availability check is a reason too
            return f"availability check failed: {exception_text(exc)}"

    def refusal(self, backend: Backend, device: torch.device) -> tuple[str, str] | None:
        if (there := self._elsewhere(backend, device)) is not None:
            return there.refusal(backend, device)
        reason = self.unavailable_reason(backend, device)
        return (UNAVAILABLE, reason) if reason else None

    def call(self, backend: Backend, call: Call, device: torch.device) -> CallResult:
        if (there := self._elsewhere(backend, device)) is not None:
            return self._noted(there.call(backend, call, device), backend)
        return self._noted(run_call(backend, call, device, self.caches), backend)

    def time(self, backend: Backend, timing: TimingCall, device: torch.device) -> TimingResult:
        if (there := self._elsewhere(backend, device)) is not None:
            return self._noted(there.time(backend, timing, device), backend)
        start = CLOCKS.now_ns()  # the same clock as the round's own here: the audit sees only a rewritten harness
        result = run_timing(backend, timing, device, self.caches)
        result.asked_ns, result.wall_ms = start, (CLOCKS.now_ns() - start) / 1e6
        return self._noted(result, backend)

    def run(self, backend: Backend, fn: Callable[..., Any], device: torch.device, *args: Any) -> Any:
        if (there := self._elsewhere(backend, device)) is not None:
            return there.run(backend, fn, device, *args)
        try:
            return fn(backend, device, *args)
        except BaseException as exc:  # noqa: B036
            raise CallFailed(self._noted(Failure.of(exc), backend)) from exc

    def worker_restarts(self) -> dict[str, int]:
        return {} if self._workers is None else self._workers.worker_restarts()

    def close(self) -> None:
        if self._workers is not None:
            self._workers.close()
            self._workers = None
