"""Where the harness's own wall time goes: exclusive seconds and counts per stage of a run, per process."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

#: a clock's contents: stage name -> (seconds, count)
Spent = dict[str, tuple[float, int]]


@dataclass
class StageClock:
    spent: Spent = field(default_factory=dict)
    #: the wall clock read at a stage's start and end
    now: Callable[[], float] = time.perf_counter
    #: one entry per open stage: the seconds spent so far in stages nested in it
    _nested: list[float] = field(default_factory=list)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Charge the wall time of the block to `name`, less the time of stages nested in it."""
        start = self.now()
        self._nested.append(0.0)
        try:
            yield
        finally:
            elapsed = self.now() - start
            nested = self._nested.pop()
            self._charge(name, elapsed - nested, 1)
            if self._nested:
                self._nested[-1] += elapsed

    def merge(self, spent: Spent) -> None:
        """Add time spent elsewhere (a worker's request) during the open stage, which is charged that much less."""
        for name, (seconds, count) in spent.items():
            self._charge(name, seconds, count)
            if self._nested:
                self._nested[-1] += seconds

    def _charge(self, name: str, seconds: float, count: int) -> None:
        s, n = self.spent.get(name, (0.0, 0))
        self.spent[name] = (s + seconds, n + count)

    def snapshot(self) -> Spent:
        return dict(self.spent)

    def since(self, before: Spent) -> Spent:
        """What was charged after `before` (a snapshot) was taken."""
        out = {}
        for name, (s, n) in self.spent.items():
            s0, n0 = before.get(name, (0.0, 0))
            if n > n0 or s > s0:
                out[name] = (s - s0, n - n0)
        return out

    def reset(self) -> None:
        self.spent.clear()


#: this process's clock: the harness's stages charge it; a run resets it when it starts
STAGE_CLOCK = StageClock()


def stage(name: str):
    """`with stage("reference"): ...` - charge the block to `name` on this process's clock."""
    return STAGE_CLOCK.stage(name)


#: the stage a timing round's samples are charged to (their own time, apart from the loop around them)
TIMED_CALLS = "timed calls"
#: what a run counts (RunRecorder.count): a (case, backend) judged by the correctness stage, a key's timing round
COUNT_CHECKED, COUNT_TIMED = "checked", "timed rounds"


def unit_costs(spent: dict) -> str:
    """'' or what a unit of each suite stage's work cost: a timed key's round against its budget (the wall / budget
    issue 63 targets), a (case, backend) of the correctness stage."""
    tests, counts, parts = spent.get("tests_s", {}), spent.get("counts", {}), []
    rounds, budget_ms = counts.get(COUNT_TIMED), spent.get("round_budget_ms")
    if rounds and tests.get("benchmark"):
        per = tests["benchmark"] / rounds
        over = f", {per * 1e3 / budget_ms:.1f}x its budget of {budget_ms:g} ms" if budget_ms else ""
        parts.append(f"a key's round {per:.2f} s{over} ({rounds} rounds)")
    if counts.get(COUNT_CHECKED) and tests.get("correctness"):
        parts.append(f"a case and backend checked {tests['correctness'] / counts[COUNT_CHECKED]:.2f} s "
                     f"({counts[COUNT_CHECKED]})")
    return "  per unit: " + "; ".join(parts) if parts else ""


def time_lines(spent: dict, top: int = 8) -> list[str]:
    """A run's time_spent (as in env.json) in two lines: wall time by suite stage, then harness stages (and a third,
    when it counted its work: unit_costs)."""
    wall = spent["wall_s"]
    tests = ", ".join(f"{name} {s:.0f} s" for name, s in spent.get("tests_s", {}).items())
    by_time = sorted(spent.get("stages", {}).items(), key=lambda kv: -kv[1]["s"])
    parts = [f"{name} {v['s']:.1f} s ({v['n']})" for name, v in by_time[:top]]
    if len(by_time) > top:
        parts.append(f"{len(by_time) - top} more {sum(v['s'] for _, v in by_time[top:]):.1f} s")
    covered = sum(v["s"] for _, v in by_time)
    parts.append(f"outside these {max(wall - covered, 0.0):.1f} s")
    lines = [f"time: {wall:.0f} s" + (f" ({tests})" if tests else ""), "  by stage: " + ", ".join(parts)]
    return lines + ([units] if (units := unit_costs(spent)) else [])
