"""What a backend's run on a case came to: how an exception becomes a status and one line, its rows and checks."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

import torch

from harness.backends.base import BackwardUnsupported, Unsupported
from harness.oracle.verdict import Check
from harness.store.schema import ERROR, OOM, UNSUPPORTED, Row, worst_status


def exception_text(exc: BaseException, limit: int = 400) -> str:
    """'Type: first line' of an exception (Unsupported: its message alone) - the one way failures are worded."""
    text = str(exc).strip().splitlines()[0][:limit] if str(exc).strip() else ""
    return text if isinstance(exc, Unsupported) else f"{type(exc).__name__}: {text}"


@dataclass(frozen=True)
class Failure:
    """Why a call gave no usable answer: a status (error, oom, unsupported, fail) and one line of text."""

    status: str
    reason: str
    #: the call raised KeyboardInterrupt: its row is written, then the run stops
    interrupted: bool = False
    #: only the backward is unsupported (BackwardUnsupported): the forward can run alone
    backward_only: bool = False

    @staticmethod
    def of(exc: BaseException) -> "Failure":
        """What a call that raised `exc` came to: unsupported, oom or error."""
        if isinstance(exc, Unsupported):
            return Failure(UNSUPPORTED, str(exc), backward_only=isinstance(exc, BackwardUnsupported))
        if isinstance(exc, KeyboardInterrupt):
            return Failure(ERROR, "KeyboardInterrupt inside the backend call", interrupted=True)
        if isinstance(exc, SystemExit):  # a backend must not end the run: it is an error of this call
            return Failure(ERROR, f"SystemExit({exc.code!r}) raised inside the backend call")
        if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
            return Failure(OOM, f"out of memory: {str(exc).splitlines()[0][:300]}")
        return Failure(ERROR, exception_text(exc))


class CallFailed(Exception):
    """A task run for a backend (an Executor's `run`) died, timed out or raised; `failure` says how."""

    def __init__(self, failure: Failure):
        super().__init__(failure.reason)
        self.failure = failure


class InterruptNoted:
    """What an executor remembers when a backend raised KeyboardInterrupt (the run stops after its row)."""

    interrupted: str | None = None

    def _noted(self, result, backend):
        if result.interrupted:
            self.interrupted = f"{backend.name} raised KeyboardInterrupt inside a call"
        return result


def free(device: torch.device) -> None:
    """Return what a failed call left behind to the allocator, so the next case starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@dataclass
class BackendResult:
    """What one backend produced on one case (canonical layout) and the rows describing it."""

    rows: list[Row]
    checks: dict[str, Check] = field(default_factory=dict)
    out: torch.Tensor | None = None
    grads: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def status(self) -> str:
        """Worst status over the phases: fail/error/oom beat pass; unsupported alone is unsupported."""
        return worst_status(r.status for r in self.rows)

    @property
    def reasons(self) -> str:
        reasons = {r.reason for r in self.rows if r.reason}
        if len(reasons) == 1 and len(self.rows) > 1 and all(r.reason for r in self.rows):
            return reasons.pop()
        return "; ".join(f"{r.phase}: {r.reason}" for r in self.rows if r.reason)

    def row(self, phase: str) -> Row:
        return next(r for r in self.rows if r.phase == phase)

    def released(self) -> "BackendResult":
        """The same verdict without the output and gradient tensors."""
        return BackendResult(self.rows, self.checks)
