"""Compiling ahead: a per-shape compiling backend's correctness calls run beside the run, last first (flex on CPU)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch

from harness.backends.base import Backend
from harness.calls.call import Call
from harness.isolation.supervisor import DEFAULT_TIMEOUT_S, Worker
from harness.isolation.wire import WorkerSpec
from harness.cases.case import AttentionCase


class Prefetcher:
    """Runs `calls` ((backend, call) in the run's order) last to first on a thread, a worker per backend."""

    def __init__(self, calls: list[tuple[Backend, Call]], device: torch.device, log_dir: str | None = None,
                 modules: tuple[str, ...] | None = None):
        self._pending = list(reversed(calls))
        # the run's workers' threads: inductor writes the thread count into the CPU kernels it compiles
        self._spec = WorkerSpec(str(device), modules,
                                torch.get_num_threads(), None if log_dir is None else str(Path(log_dir) / "prefetch"))
        self._claimed: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        #: for env.json: the calls it finished, its seconds, why it ended
        self.done: list[str] = []
        self.seconds = 0.0
        self.ended = ""
        self._thread = threading.Thread(target=self._run, name="harness-prefetch", daemon=True)
        self._thread.start()

    def claim(self, backend: Backend, case: AttentionCase) -> None:
        """The run is about to check `backend` on `case` itself: not started here."""
        with self._lock:
            self._claimed.add((backend.name, case.id))

    def _next(self) -> tuple[Backend, Call] | None:
        with self._lock:
            while self._pending and not self._stopping.is_set():
                backend, call = self._pending.pop(0)
                if (backend.name, call.case.id) not in self._claimed:
                    self._claimed.add((backend.name, call.case.id))
                    return backend, call
        return None

    def _run(self) -> None:
        start, workers = time.monotonic(), {}
        try:
            while (item := self._next()) is not None:
                backend, call = item
                if (worker := workers.get(backend.name)) is None:
                    worker = workers[backend.name] = Worker(backend.name, self._spec)
                if worker.start_failure is not None:
                    self.ended = f"the worker of {backend.name} could not start: {worker.start_failure.reason}"
                    return
                status, answer = worker.ask("call", call.to_cpu(), DEFAULT_TIMEOUT_S,
                                            f"compiling {backend.name} on {call.case.id} ahead", beside=True)
                if status != "ok":  # the run's own call will meet the same failure and record it
                    self.ended = f"ended at {call.case.id}: {answer.reason}"
                    return
                self.done.append(f"{backend.name}:{call.case.id}")
            self.ended = "stopped before timing" if self._stopping.is_set() else "met the run"
        finally:
            for worker in workers.values():
                worker.stop()
            self.seconds = time.monotonic() - start

    def stop(self) -> None:
        """Start nothing more; wait for the call in hand and the worker's end."""
        self._stopping.set()
        self._thread.join()

    def summary(self) -> dict:
        return {"calls": len(self.done), "seconds": round(self.seconds, 3), "ended": self.ended}
