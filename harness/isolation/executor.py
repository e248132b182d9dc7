"""Where backend calls run: the Executor protocol and the one factory of its two implementations."""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from harness.backends.base import Backend
from harness.calls.call import Call, CallResult
from harness.isolation.in_process import InProcessExecutor
from harness.calls.outcome import CallFailed
from harness.isolation.supervisor import DEFAULT_TIMEOUT_S, IsolatedExecutor
from harness.calls.timed import TimingCall, TimingResult

__all__ = ["CallFailed", "Executor", "make_executor"]


class Executor(Protocol):
    """Runs a backend's calls, timing rounds and tasks on a device, and turns every failure into a result."""

    #: whether the calls run in worker processes (inputs are then drawn there, from the seed)
    isolated: bool
    #: what env.json and the summary say of where backend code ran (supervisor.ISOLATED, in_process.UNGUARDED)
    integrity: str
    #: set when a backend raised KeyboardInterrupt inside a call: its row is recorded, then the run stops
    interrupted: str | None

    def unavailable_reason(self, backend: Backend, device: torch.device) -> str | None:
        """Why `backend` cannot run on `device` at all (not installed, wrong device, a broken check), or None."""

    def refusal(self, backend: Backend, device: torch.device) -> tuple[str, str] | None:
        """(status, reason) when `backend` cannot run on `device`: unavailable, or error (a worker did not start)."""

    def call(self, backend: Backend, call: Call, device: torch.device) -> CallResult:
        """One correctness call; a raise, a crash or a timeout comes back as its failure."""

    def time(self, backend: Backend, timing: TimingCall, device: torch.device) -> TimingResult:
        """One timing round of one phase, run where the backend runs."""

    def run(self, backend: Backend, fn: Callable[..., Any], device: torch.device, *args: Any) -> Any:
        """fn(backend, device, *args), our code around a backend; anything it raises, or a death, is CallFailed."""

    def worker_restarts(self) -> dict[str, int]:
        """Workers replaced after dying or timing out, per backend."""

    def close(self) -> None:
        """Stop what the executor started (its workers)."""


def make_executor(device: torch.device | str | None = None, *, isolate: bool = False, timeout_s: float | None = None,
                  timeouts: tuple[tuple[str, float], ...] = (), log_dir: str | None = None,
                  threads: int | None = None, modules: tuple[str, ...] | None = None) -> Executor:
    """A run's own executor: in this process, or (isolate=True) each backend in a supervised worker on `device`."""
    if not isolate:
        return InProcessExecutor()
    if device is None:
        raise ValueError("make_executor(isolate=True) needs the device its workers run on")
    return IsolatedExecutor(device, modules=modules, threads=threads,
                            timeout_s=DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s, timeouts=timeouts,
                            log_dir=log_dir)
