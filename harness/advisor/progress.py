"""Progress while a long job runs (recommend, `pytest suites`): step i of n, the time elapsed and what is left."""

from __future__ import annotations

import sys
import time
from typing import Callable, Sequence, TextIO


#: with weights in estimated seconds, the estimate counts as this share of the job's work done at its own pace
#: (1): the first lines project the estimate, corrected by the pace measured as the steps run, not one step's time
#: (a first step that took 6.8 min once projected ~164 min left, the next ~85)
ESTIMATE_SHARE = 0.1


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


class Progress:
    """One line per finished step on `out` (stderr: stdout keeps the table), or through `say` when given.

    The time left is the time so far per unit of work times the work remaining: a step's work is 1, or its entry
    of `weights` (e.g. the cost model's seconds per case). With `estimated` (weights are the estimate's seconds),
    the pace starts at the estimate's and moves to the measured one (ESTIMATE_SHARE). With `every_s`, a line only
    when that many seconds passed since the last one, at the last step, or when a step asks (`force`)."""

    def __init__(self, total: int, *, out: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 weights: Sequence[float] | None = None, estimated: bool = False, every_s: float = 0.0,
                 say: Callable[[str], object] | None = None):
        if total < 1:
            raise ValueError(f"Progress(total={total!r}): needs at least one step")
        if weights is not None and (len(weights) != total or any(not w > 0 for w in weights)):
            raise ValueError(f"Progress: needs one weight > 0 per step ({total}); got {len(weights)}")
        self.total, self.done = total, 0
        self.weights = list(weights) if weights is not None else [1.0] * total
        self.prior = ESTIMATE_SHARE * sum(self.weights) if estimated and weights is not None else 0.0
        self.out = out if out is not None else sys.stderr
        self.say, self.clock, self.every_s = say, clock, every_s
        self.start = self.last = clock()

    def step(self, what: str, *, force: bool = False) -> str | None:
        """Count one finished step; print and return its line (None when `every_s` says it is not due yet)."""
        self.done = min(self.done + 1, self.total)
        now = self.clock()
        if not (force or self.done == self.total or now - self.last >= self.every_s):
            return None
        self.last = now
        pace = (now - self.start + self.prior) / (sum(self.weights[:self.done]) + self.prior)
        left = pace * sum(self.weights[self.done:])
        line = (f"[{self.done}/{self.total}] {what}; {_duration(now - self.start)} elapsed, "
                + ("done" if self.done == self.total else f"~{_duration(left)} left"))
        if self.say is not None:
            self.say(line)
        else:
            print(line, file=self.out, flush=True)
        return line
