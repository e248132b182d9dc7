"""The in-process Executor (--no-isolate, the Python API's default): a backend's crash or hang is the run's."""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness.backends.base import Backend
from harness.execution.cache import CallCaches
from harness.execution.call import Call, CallResult, run_call
from harness.execution.outcome import CallFailed, Failure, InterruptNoted, exception_text
from harness.execution.timed import TimingCall, TimingResult, run_timing
from harness.measure.timing import CLOCKS
from harness.store.schema import UNAVAILABLE


class InProcessExecutor(InterruptNoted):
    """Runs every backend call here, with caches and an interrupt note of its own."""

    isolated = False

    def __init__(self):
        self.caches = CallCaches()

    def unavailable_reason(self, backend: Backend, device: torch.device) -> str | None:
        try:
            return backend.unavailable_reason(device)
        except Exception as exc:  # a broken availability check is a reason too
            return f"availability check failed: {exception_text(exc)}"

    def refusal(self, backend: Backend, device: torch.device) -> tuple[str, str] | None:
        reason = self.unavailable_reason(backend, device)
        return (UNAVAILABLE, reason) if reason else None

    def call(self, backend: Backend, call: Call, device: torch.device) -> CallResult:
        return self._noted(run_call(backend, call, device, self.caches), backend)

    def time(self, backend: Backend, timing: TimingCall, device: torch.device) -> TimingResult:
        start = CLOCKS.now_ns()  # the same clock as the round's own here: the audit sees only a rewritten harness
        result = run_timing(backend, timing, device, self.caches)
        result.asked_ns, result.wall_ms = start, (CLOCKS.now_ns() - start) / 1e6
        return self._noted(result, backend)

    def run(self, backend: Backend, fn: Callable[..., Any], device: torch.device, *args: Any) -> Any:
        try:
            return fn(backend, device, *args)
        except BaseException as exc:  # noqa: B036
            raise CallFailed(self._noted(Failure.of(exc), backend)) from exc

    def worker_restarts(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass
