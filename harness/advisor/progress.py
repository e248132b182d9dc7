"""recommend's progress while it runs: step i of n, what it did, the time elapsed and an estimate of what is left."""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


class Progress:
    """One line per finished step on `out` (stderr: stdout keeps the table). The estimate left is the mean time
    of the steps so far times the steps remaining, so it settles as the run goes (the first step, the float64
    reference and baseline, is the longest on a CPU: the first estimates are high)."""

    def __init__(self, total: int, *, out: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        if total < 1:
            raise ValueError(f"Progress(total={total!r}): needs at least one step")
        self.total, self.done = total, 0
        self.out = out if out is not None else sys.stderr
        self.clock = clock
        self.start = clock()

    def step(self, what: str) -> str:
        """Count one finished step, print and return its line."""
        self.done = min(self.done + 1, self.total)
        elapsed = self.clock() - self.start
        left = elapsed / self.done * (self.total - self.done)
        line = (f"[{self.done}/{self.total}] {what}; {_duration(elapsed)} elapsed, "
                + ("done" if self.done == self.total else f"~{_duration(left)} left"))
        print(line, file=self.out, flush=True)
        return line
