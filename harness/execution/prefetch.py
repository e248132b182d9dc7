"""Compiling ahead: the session's one prefetcher runs the correctness calls of a backend that compiles every new
shape (flex on the CPU) in a worker of its own, from the last call back, while the run goes from the first; each
call it finished is a hit in torch's on-disk compile cache when the run reaches it.

Why: on the CPU a flex graph is one g++ compile of ~5 s on one core (torch 2.13; ~30 graphs in `default`), while the
run's own probes and correctness checks leave the second core mostly idle. Nothing is timed while it runs: the
session stops it when the benchmark stage begins or at its first timing round, and it waits for the compile in hand
rather than kill it, so no compiler outlives it beside a timing and no half-written library is left in the cache.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch

from harness.backends.base import Backend
from harness.backends.registry import loaded_modules
from harness.execution.call import Call
from harness.execution.supervisor import DEFAULT_TIMEOUT_S, Worker, worker_context
from harness.execution.wire import WorkerSpec
from harness.spec.case import AttentionCase


class Prefetcher:
    """Runs `calls` ((backend, call) in the order the run will reach them) last to first on a thread, one worker
    per backend, answers thrown away. `claim` marks what the run has reached (skipped here); `stop` ends it."""

    def __init__(self, calls: list[tuple[Backend, Call]], device: torch.device, log_dir: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, modules: tuple[str, ...] | None = None):
        self._pending = list(reversed(calls))
        # the run's workers' threads, as inductor writes the thread count into the CPU kernels it compiles (with
        # another count not one of its graphs is a cache hit for the run); the compiler is one process either way
        self._spec = WorkerSpec(str(device), loaded_modules() if modules is None else modules,
                                torch.get_num_threads(), None if log_dir is None else str(Path(log_dir) / "prefetch"))
        self.timeout_s = timeout_s
        self._claimed: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        #: what it did, for env.json: the calls it finished, its seconds, and why it ended
        self.done: list[str] = []
        self.seconds = 0.0
        self.ended = ""
        self._thread = threading.Thread(target=self._run, name="harness-prefetch", daemon=True)
        self._thread.start()

    def claim(self, backend: Backend, case: AttentionCase) -> None:
        """The run is about to check `backend` on `case` itself: the prefetcher will not start that call."""
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
        start, workers, ctx = time.monotonic(), {}, worker_context()
        try:
            while (item := self._next()) is not None:
                backend, call = item
                worker = workers.get(backend.name)
                if worker is None:
                    worker = workers[backend.name] = Worker(backend.name, self._spec, ctx)
                if worker.start_failure is not None:
                    self.ended = f"the worker of {backend.name} could not start: {worker.start_failure.reason}"
                    return
                status, answer = worker.ask("call", call.to_cpu(), self.timeout_s,
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
        """Start nothing more and wait for the call in hand (one compile, seconds) and the worker's end."""
        self._stopping.set()
        self._thread.join()

    def summary(self) -> dict:
        return {"calls": len(self.done), "seconds": round(self.seconds, 3), "ended": self.ended}
