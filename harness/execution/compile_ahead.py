"""Compile-ahead for a backend that compiles every new shape (flex): a second worker of it runs the run's
correctness calls from the last one backwards, filling torch's on-disk compile cache, while the run's own worker
runs them from the first; where they meet, each call the other compiled is a cache hit.

Why: on the CPU a flex graph is one g++ compile of ~7-9 s on one core (torch 2.13: ~310 s for the 35 forward
graphs of the default matrix, benchmarks/flex_compile_study.py), and the run's other work leaves the second core
idle meanwhile - most of all through the probes, which the suite runs first for that reason (suite/plugin.py
STAGES). It runs only while nothing is timed: the executor stops it (kills its worker) before the first timing or a
task that times, so no timing shares the machine with a compile.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

from harness.execution.call import Call
from harness.execution.isolation import START_TIMEOUT_S, Worker, WorkerSpec


class CompileAhead:
    """One backend's compile-ahead worker, driven by a thread; `claim(case_id)` marks a case the run has reached
    (the compile-ahead skips it), `stop()` ends it at once."""

    def __init__(self, backend_name: str, calls: list[Call], spec: WorkerSpec, ctx, timeout_s: float):
        self.backend_name, self.timeout_s = backend_name, timeout_s
        log_dir = None if spec.log_dir is None else str(Path(spec.log_dir) / "compile-ahead")
        self._spec, self._ctx = replace(spec, log_dir=log_dir), ctx
        self._pending = list(reversed(calls))  # the run goes first to last: this worker takes last to first
        self._claimed: set[str] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._worker: Worker | None = None
        #: what it did, for the run's env: calls it ran, and seconds until it ended
        self.done: list[str] = []
        self.seconds = 0.0
        self.why_ended = ""
        self._thread = threading.Thread(target=self._run, name=f"compile-ahead-{backend_name}", daemon=True)
        self._thread.start()

    def claim(self, case_id: str) -> None:
        """The run is about to call this case: the compile-ahead will not start it."""
        with self._lock:
            self._claimed.add(case_id)

    def _next(self) -> Call | None:
        with self._lock:
            while self._pending:
                call = self._pending.pop(0)
                if call.case.id not in self._claimed:
                    self._claimed.add(call.case.id)
                    return call
        return None

    def _run(self) -> None:
        start = time.monotonic()
        try:
            self._worker = Worker(self.backend_name, self._spec, self._ctx)
            if self._worker.start_failure is not None:
                self.why_ended = f"its worker could not start: {self._worker.start_failure.reason}"
                return
            while not self._stopped.is_set():
                call = self._next()
                if call is None:
                    self.why_ended = "met the run"
                    return
                reply = self._worker.ask("call", call.to_cpu(), self.timeout_s,
                                         f"compiling {self.backend_name} on {call.case.id} ahead", beside_the_run=True)
                if reply[0] != "ok":
                    if not self._stopped.is_set():
                        self.why_ended = f"ended at {call.case.id}: {reply[1].reason}"
                    return
                self.done.append(call.case.id)
        except (OSError, EOFError, ValueError) as exc:  # the worker was killed by stop(), or its pipe broke
            self.why_ended = self.why_ended or f"stopped: {type(exc).__name__}"
        finally:
            self.seconds = time.monotonic() - start
            if self._stopped.is_set() and not self.why_ended:
                self.why_ended = "stopped by the run (timing started)"
            if self._worker is not None:
                self._worker.kill()

    def stop(self) -> None:
        """End it now: its worker is killed (a compile cut short leaves no cache entry: inductor writes atomically)
        and the thread joined."""
        self._stopped.set()
        worker = self._worker
        if worker is not None and worker.process.is_alive():
            worker.process.kill()
        self._thread.join(timeout=START_TIMEOUT_S)

    def summary(self) -> dict:
        return {"calls": len(self.done), "seconds": round(self.seconds, 3), "ended": self.why_ended}
