"""Shrinking a failing case: the smallest case (harness.fuzzing.space's knobs) that still fails the same check, found by
a deterministic greedy search - the big reductions first (halving each size), then removals, then a binary search
per size - within a trial and time bound."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch

from harness.backends.base import Backend
from harness.isolation.executor import Executor
from harness.calls.outcome import BackendResult
from harness.run.runner import execute, prepare_case
from harness.cases.case import AttentionCase
from harness.fuzzing.space import SIZES, Knobs, build, simpler_steps, size_of, with_size
from harness.store.schema import FAIL, FAILING, QUANTITIES, VERDICT_PHASES

#: trials one failure's shrinking may run (each a float64 reference and a backend call); the order is fixed, so
#: within this bound the same failure shrinks to the same case
TRIALS = 80
#: seconds the whole run's shrinking may take (docs/fuzzing.md): past it, the failures left keep their drawn case
BOUND_S = 120.0


class Signature(NamedTuple):
    """A check a case fails: the phase, the status and the quantity past tolerance (or the error's type)."""

    phase: str
    status: str
    what: str

    def __str__(self) -> str:
        return f"{self.status} [{self.phase}] {self.what}"


def failed_checks(result: BackendResult) -> tuple[Signature, ...]:
    """Every check `result` fails, fwd first: one per quantity past tolerance, or the error's type per phase."""
    found = []
    for phase in VERDICT_PHASES:
        row = next((r for r in result.rows if r.phase == phase), None)
        if row is None or row.status not in FAILING:
            continue
        if row.status == FAIL:
            over = [q for q in QUANTITIES if _past(getattr(row, f"{q}_err"), getattr(row, f"{q}_tol"))]
            found += [Signature(phase, row.status, q) for q in over or ["nonfinite"]]
        else:
            found.append(Signature(phase, row.status, (row.reason or "").split(":")[0]))
    return tuple(found)


def signature(result: BackendResult) -> Signature | None:
    """The first check `result` fails (the one its shrinking keeps failing), or None when nothing failed."""
    return next(iter(failed_checks(result)), None)


def _past(err: float | None, tol: float | None) -> bool:
    return err is not None and tol is not None and not err <= tol               # NaN errors count as past


@dataclass
class Trials:
    """Runs `backend` on cases with the run's seed, remembering each case's signature (shrinks share their steps)."""

    backend: Backend
    device: torch.device
    seed: int
    executor: Executor
    seen: dict[str, tuple[Signature, ...]] = field(default_factory=dict)
    count: int = 0

    def checks(self, case: AttentionCase) -> tuple[Signature, ...]:
        """The checks `case` fails on the backend (run once per case)."""
        key = case.spelled_id
        if key not in self.seen:
            self.count += 1
            result = execute(self.backend, prepare_case(case, self.device, self.seed), executor=self.executor)
            self.seen[key] = failed_checks(result)
        return self.seen[key]


@dataclass(frozen=True)
class Shrunk:
    """A failure's smallest case found, the steps that led there and the trials run ('bound' when one stopped it)."""

    knobs: Knobs
    case: AttentionCase
    steps: tuple[str, ...]
    trials: int
    stopped: str = ""


def reproduces(candidate: Knobs, target: Signature, trials: Trials) -> AttentionCase | None:
    """The case of `candidate` when it is valid, the backend takes it and it fails `target`; else None."""
    try:
        built = build(candidate)
    except ValueError:
        return None
    if trials.backend.can_run(built, trials.device):
        return None
    return built if target in trials.checks(built) else None


def inside(k: Knobs, pins: dict[str, int]) -> bool:
    """Whether `k` has every size of `pins` at its value (a failure's trigger region; no pins: nowhere)."""
    return bool(pins) and all(size_of(k, name) == value for name, value in pins.items())


def needs_one(smallest: Knobs, target: Signature, trials: Trials) -> dict[str, int]:
    """The sizes a failure needs at 1: those its smallest case has at 1 that, raised to 2, pass (a bug of a batch of
    one needs batch 1). Another failure's shrink keeps out of that region, so two bugs in one drawn case are two
    failures rather than the first one found twice (one trial per size at 1, on the smallest case)."""
    pins = {}
    for name in SIZES:
        if isinstance(getattr(smallest, name), int) and size_of(smallest, name) == 1:
            try:
                raised = build(with_size(smallest, name, 2))
            except ValueError:
                continue
            if not trials.backend.can_run(raised, trials.device) and target not in trials.checks(raised):
                pins[name] = 1
    return pins


def shrink(knobs: Knobs, target: Signature, trials: Trials, deadline: float,
           clock: Callable[[], float] = time.monotonic, avoid: tuple[dict[str, int], ...] = ()) -> Shrunk:
    """The smallest knobs whose case still fails `target` (among others), by three passes repeated until nothing
    changes or a bound is reached: the big reductions first (each size, dimension by dimension, to 1 or else to its
    half: every trial after them is cheap, so a long case gets near its trigger well inside the bounds), then each
    removal, then each size lowered by a binary search from 1 (the exact least value). No step enters a region of
    `avoid` (known failures' `needs_one`)."""
    current, case, steps, start = knobs, build(knobs), [], trials.count
    # sizes whose halving failed, not tried again until another size drops to 1 (a change that can free them)
    kept: set[tuple[str, int]] = set()

    def still_fails(candidate: Knobs) -> AttentionCase | None:
        if any(inside(candidate, pins) for pins in avoid):
            return None
        built = reproduces(candidate, target, trials)
        return None if built == case else built

    def out_of_bounds() -> str:
        return ("trial bound" if trials.count - start >= TRIALS else "time bound" if clock() >= deadline else "")

    def halve() -> bool:
        """Each size to 1, or else to half its value, where the case still fails (one pass over the sizes)."""
        nonlocal current, case
        changed = False
        for name in SIZES:
            value = size_of(current, name)
            if value is None or value <= 1 or (name, value) in kept:
                continue
            for smaller in dict.fromkeys((1, value // 2)):
                if out_of_bounds():
                    return changed
                if (built := still_fails(with_size(current, name, smaller))) is not None:
                    current, case, changed = with_size(current, name, smaller), built, True
                    steps.append(f"{name} {value} -> {smaller}")
                    if smaller == 1:
                        kept.clear()
                    break
            else:
                kept.add((name, value))
        return changed

    def remove() -> bool:
        """The first removal (SIMPLER's order) that keeps the failure."""
        nonlocal current, case
        for name, candidate in simpler_steps(current):
            if out_of_bounds():
                return False
            if (built := still_fails(candidate)) is not None:
                current, case = candidate, built
                steps.append(name)
                return True
        return False

    def bisect() -> bool:
        """The first size a binary search between 1 and its value lowers (hi fails; values <= lo do not)."""
        nonlocal current, case
        for name in SIZES:
            value = size_of(current, name)
            if value is None or value <= 1 or out_of_bounds():
                continue
            lo, hi, found = 0, value, None
            while hi - lo > 1 and not out_of_bounds():
                mid = 1 if lo == 0 else (lo + hi) // 2
                if (built := still_fails(with_size(current, name, mid))) is not None:
                    hi, found = mid, built
                else:
                    lo = mid
            if found is not None:
                current, case = with_size(current, name, hi), found
                steps.append(f"{name} {value} -> {hi}")
                return True
        return False

    while not out_of_bounds() and (halve() or remove() or bisect()):
        pass
    return Shrunk(current, case, tuple(steps), trials.count - start, out_of_bounds())
