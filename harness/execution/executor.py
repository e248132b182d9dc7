"""Where backend calls run: `Executor` runs them in this process (--no-isolate, and the Python API's default);
harness.execution.isolation.IsolatedExecutor runs each backend in a supervised worker process."""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness.backends.base import Backend
from harness.execution.cache import DRAWN_INPUTS, LRU
from harness.execution.call import Call, CallResult, run_call
from harness.execution.outcome import Failure, exception_text
from harness.execution.timed import TimingCall, TimingResult, run_timing
from harness.store.schema import UNAVAILABLE


class CallFailed(Exception):
    """A task run for a backend (`Executor.run`) died, timed out or raised; `failure` says how."""

    def __init__(self, failure):
        super().__init__(failure.reason)
        self.failure = failure


class Executor:
    """Runs every backend call in this process: a crash or hang of a backend is the run's."""

    isolated = False
    #: set when a backend call raised KeyboardInterrupt: its row is recorded, then the run stops (see the plugin)
    interrupted: str | None = None

    def __init__(self):
        #: the inputs this executor drew from a seed last (cache.DRAWN_INPUTS), its own: gone with it
        self.drawn = LRU(DRAWN_INPUTS)

    def _note_interrupt(self, backend: Backend) -> None:
        """Remember that `backend` raised KeyboardInterrupt inside a call (this wording is what stops the run)."""
        self.interrupted = f"{backend.name} raised KeyboardInterrupt inside a call"

    def _noted(self, result: CallResult | TimingResult, backend: Backend):
        """`result` as is, remembering a KeyboardInterrupt inside the backend."""
        if result.interrupted:
            self._note_interrupt(backend)
        return result

    def unavailable_reason(self, backend: Backend, device: torch.device) -> str | None:
        try:
            return backend.unavailable_reason(device)
        except Exception as exc:  # a broken availability check is a reason too
            return f"availability check failed: {exception_text(exc)}"

    def refusal(self, backend: Backend, device: torch.device) -> tuple[str, str] | None:
        """(status, reason) when `backend` cannot run on `device` at all: 'unavailable' (not installed, wrong
        device, a broken availability check), or 'error' where the harness itself could not set it up."""
        reason = self.unavailable_reason(backend, device)
        return (UNAVAILABLE, reason) if reason else None

    def call(self, backend: Backend, call: Call, device: torch.device) -> CallResult:
        return self._noted(run_call(backend, call, device, self.drawn), backend)

    def time(self, backend: Backend, timing: TimingCall, device: torch.device) -> TimingResult:
        return self._noted(run_timing(backend, timing, device, self.drawn), backend)

    def run(self, backend: Backend, fn: Callable[..., Any], device: torch.device, *args: Any) -> Any:
        """fn(backend, device, *args) - our own code around a backend (a probe, a deployment check); anything it
        raises comes back as CallFailed, as it would from a worker."""
        try:
            return fn(backend, device, *args)
        except BaseException as exc:  # noqa: B036
            failure = Failure.of(exc)
            if failure.interrupted:
                self._note_interrupt(backend)
            raise CallFailed(failure) from exc

    def worker_restarts(self) -> dict[str, int]:
        """How many workers were replaced after dying or timing out, per backend (none in this process)."""
        return {}

    def close(self) -> None:
        pass


IN_PROCESS = Executor()
