"""`check --fuzz`: seeded cases drawn within each backend's declarations until the cost model's budget is spent, each
checked in draw order until the budget's wall time is spent, and each failure shrunk to its smallest case; the
distinct failures, once each, with their repro command."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from harness.backends.base import Backend
from harness.planning.fitted import fitted_case_cost
from harness.run.session import RunSession
from harness.fuzzing.shrink import (BOUND_S, TRIALS, Shrunk, Signature, Trials, failed_checks, inside,
                                      needs_one, reproduces, shrink)
from harness.cases.case import AttentionCase
from harness.fuzzing.space import SIZES, Knobs, Space, build, draw, size_of, toward, with_size
from harness.store.schema import COLUMNS

#: no drawn case's reference and baseline may take more than this share of the budget: it tries many small cases
LARGEST_SHARE = 0.1
#: draws before a draw the backend takes is given up (its declarations leave little of the space), and draws in a
#: row too big for the budget before the plan ends
TRIES = 200


@dataclass(frozen=True)
class Planned:
    """A drawn case, its knobs, the backends that take it and its estimated seconds."""

    knobs: Knobs
    case: AttentionCase
    backends: tuple[Backend, ...]
    seconds: float
    #: the cost model's seconds for its float64 reference and baseline alone
    reference_s: float = 0.0


def plan(backends: list[Backend], device: torch.device, seed: int, budget_s: float) -> list[Planned]:
    """Cases drawn from `seed`, round robin over the backends (each case within the drawing backend's declarations,
    run by every backend that takes it), until their estimated seconds would pass `budget_s` (at least one)."""
    rng = np.random.default_rng(seed)
    spaces = [(b, Space.of(b, device.type)) for b in backends]
    planned, spent, turn, idle, too_big = [], 0.0, 0, 0, 0
    while spaces and idle < len(spaces) and too_big < TRIES:
        backend, space = spaces[turn % len(spaces)]
        turn += 1
        for _ in range(TRIES):
            knobs = draw(rng, space)
            try:
                case = build(knobs)
            except ValueError:
                continue
            if not backend.can_run(case, device):
                break
        else:
            idle += 1
            continue
        runners = tuple(b for b in backends if not b.can_run(case, device))
        sized, seconds, fits = fitted_case_cost(case, runners, device)  # the one cost model, its fitted unit costs
        if sized > LARGEST_SHARE * budget_s or not fits:
            too_big += 1                               # too big for this budget or device: draw again
            continue
        if planned and spent + seconds > budget_s:
            break                                      # (the first case is planned even past it: a run tries one)
        idle, too_big, spent = 0, 0, spent + seconds
        planned.append(Planned(knobs, case, runners, seconds, sized))
    return planned


@dataclass
class Finding:
    """One distinct failure: a backend, the check it fails, its smallest case and how many drawn cases fell to it."""

    backend: str
    check: Signature
    shrunk: Shrunk
    repro: str
    #: the sizes it needs at 1 (shrink.needs_one): other failures' shrinks keep out of that region
    pins: dict[str, int] = field(default_factory=dict)
    drawn: list[str] = field(default_factory=list)

    def record(self) -> dict:
        return {"backend": self.backend, "check": str(self.check), "case": self.shrunk.case.spelled_id,
                "needs_one": sorted(self.pins),
                "repro": self.repro, "drawn_cases": len(self.drawn), "steps": list(self.shrunk.steps),
                "trials": self.shrunk.trials, "stopped": self.shrunk.stopped, "first_drawn": self.drawn[0]}


@dataclass
class FuzzRun:
    """What `check --fuzz` did: the seed, budget, cases drawn and their estimated and actual seconds, failures."""

    seed: int
    budget_s: float
    drawn: int
    estimated_s: float
    #: drawn cases checked before the budget's wall time was spent (a prefix of the draw: the order is the seed's)
    run: int = 0
    #: the cost model's reference-and-baseline seconds, backend calls and per-shape compiles of the cases run
    #: (benchmarks/fuzz_study.py fit reads them to refit the CPU's call_s and compile_s: planning/cost.py)
    reference_s: float = 0.0
    calls: int = 0
    compiles: int = 0
    check_s: float = 0.0
    shrink_s: float = 0.0
    #: failing drawn cases the shrinking's bound left unshrunk (their rows carry their own repro command)
    unshrunk: int = 0
    #: (drawn case, backend) pairs that failed a check: results.csv's failing drawn rows, counted once a case
    failing: int = 0
    failures: list[Finding] = field(default_factory=list)

    def record(self) -> dict:
        """env.json's "fuzz" entry (the report's fuzz section reads it)."""
        return {"seed": self.seed, "budget_s": self.budget_s, "drawn": self.drawn, "estimated_s": self.estimated_s,
                "run": self.run, "reference_s": round(self.reference_s, 2), "calls": self.calls,
                "compiles": self.compiles, "check_s": round(self.check_s, 1), "shrink_s": round(self.shrink_s, 1),
                "shrink_bound_s": BOUND_S, "shrink_trials": TRIALS, "unshrunk": self.unshrunk, "failing": self.failing,
                "failures": [f.record() for f in self.failures]}


def fuzz_in_session(session: RunSession, backends: list[Backend], planned: list[Planned],
                    budget_s: float) -> tuple[pd.DataFrame, FuzzRun]:
    """Check the planned cases in draw order on the backends that take them (rows written) until `budget_s` of wall
    time is spent (the cost model sized the plan; a loaded machine runs fewer: a prefix of the seed's draw, so a seed
    reproduces its failures given the time), then shrink each failure: drawn cases that shrink to the same smallest
    case and check are one failure. env.json gets the run's record."""
    run = FuzzRun(session.seed, budget_s, len(planned), round(sum(p.seconds for p in planned), 1))
    rows, failing, complete, start = [], [], False, time.monotonic()
    session.compile_ahead([(p.case, b) for p in planned for b in p.backends])
    try:
        for item in planned:
            if run.run and time.monotonic() - start >= budget_s:
                break                                   # the wall budget is spent: the rest is counted, not run
            run.run += 1
            run.reference_s += item.reference_s
            run.calls += len(item.backends)
            run.compiles += sum(b.compiles_per_shape for b in item.backends)
            for backend in item.backends:
                result = session.check(item.case, backend)
                rows.extend(result.rows)
                if checks := failed_checks(result):
                    failing.append((item, backend, checks))
                if session.executor.interrupted:
                    raise KeyboardInterrupt(f"{session.executor.interrupted}; the rows so far are written")
        run.check_s = time.monotonic() - start
        run.failing = len(failing)
        run.failures, run.unshrunk = _shrink_all(session, failing, time.monotonic() + BOUND_S)
        run.shrink_s = time.monotonic() - start - run.check_s
        complete = True
    finally:
        session.env["fuzz"] = run.record()
        session.finish(complete=complete)
    frame = pd.DataFrame([r.as_dict() for r in rows]).reindex(columns=[c for c in COLUMNS if c != "schema_version"])
    return frame, run


def _shrink_all(session: RunSession, failing: list, deadline: float) -> tuple[list[Finding], int]:
    """Shrink the failures within `deadline`, each keeping its first failed check: first one drawn case per (backend,
    check), cheapest first, each with an equal share of the time left; then the other failing cases while time is
    left, each first moved to where a known failure shrank (`toward`: one trial) and shrunk from there when it still
    fails (trials are shared per backend, so it then costs little). A shrink keeps out of known failures' triggers
    (`needs_one`: a batch of one) its drawn case lacks, and a drawn case inside one is first tried outside it; one
    that shrank onto a trigger it lacks is shrunk again outside it: two bugs in one drawn case are two failures.
    One Finding per backend and smallest case; the count of failing drawn cases the bound left unshrunk is returned
    beside them."""
    trials: dict[str, Trials] = {}
    found: dict[tuple[str, str], Finding] = {}
    ordered = sorted(failing, key=lambda f: f[0].seconds)
    firsts = sorted({(b.name, checks[0]): (item, b, checks) for item, b, checks in reversed(ordered)}.values(),
                    key=lambda f: f[0].seconds)
    rest = [f for f in ordered if not any(f is g for g in firsts)]
    unshrunk = 0
    for index, (item, backend, checks) in enumerate(firsts + rest):
        now = time.monotonic()
        if now >= deadline:
            unshrunk += 1
            continue
        share = (deadline - now) / (len(firsts) - index) if index < len(firsts) else deadline - now
        runner = trials.setdefault(backend.name, Trials(backend, session.device, session.seed, session.executor))
        runner.seen[item.case.spelled_id] = checks
        known = [f for f in found.values() if f.backend == backend.name]
        start, avoid = item.knobs, tuple(f.pins for f in known if f.pins and not inside(item.knobs, f.pins))
        for f in (f for f in known if inside(item.knobs, f.pins)):      # in a known trigger: does it fail without?
            escaped = item.knobs
            for name in f.pins:
                escaped = with_size(escaped, name, 2)
            if reproduces(escaped, checks[0], runner):
                start, avoid = escaped, avoid + (f.pins,)
        for f in known:                                          # the same failure as a known one? one trial
            if f.pins in avoid or not _shares_sizes(start, f.shrunk.knobs):
                continue
            if reproduces(jump := toward(start, f.shrunk.knobs, f.shrunk.steps), checks[0], runner):
                start = jump
                break
        while True:
            shrunk = shrink(start, checks[0], runner, min(deadline, now + share), avoid=avoid)
            held = held_off(shrunk.knobs, avoid, [f for f in found.values() if f.backend == backend.name], checks[0])
            key = (backend.name, held.shrunk.case.spelled_id if held else shrunk.case.spelled_id)
            if key not in found:
                found[key] = Finding(backend.name, checks[0], shrunk, session.repro_command(shrunk.case, backend.name),
                                     needs_one(shrunk.knobs, checks[0], runner))
            if item.case.spelled_id not in found[key].drawn:  # re-shrunk outside a trigger onto the same one: once
                found[key].drawn.append(item.case.spelled_id)
            pins = found[key].pins
            # it shrank onto a trigger its start lacks (a batch of one from a batch of two): the start fails
            # for another reason too, so it is shrunk again outside that trigger
            if not pins or inside(start, pins) or pins in avoid or time.monotonic() >= deadline:
                break
            avoid += (pins,)
    return sorted(found.values(), key=lambda f: (f.backend, -len(f.drawn))), unshrunk


def held_off(smallest: Knobs, avoid: tuple[dict[str, int], ...], known: list[Finding], check: Signature
             ) -> Finding | None:
    """The known failure of `check` whose smallest case `smallest` is but for the triggers its shrink kept out of:
    the same failure, held off its smallest case by another's trigger (a group of 3 kept at batch 2 by a batch-1
    bug, where the group's own smallest case has batch 1 and one key, outside that bug's trigger)."""
    for pins in avoid:
        moved = smallest
        for name, value in pins.items():
            moved = with_size(moved, name, value)
        try:
            case = build(moved)
        except ValueError:
            continue
        for f in known:
            if f.check == check and f.shrunk.case == case:
                return f
    return None


def run_line(fuzz: dict) -> str:
    """How much of the draw ran within the wall budget, and the shrinking's own time and bound (env.json's record)."""
    ran = fuzz.get("run", fuzz["drawn"])                            # a run before the wall stop ran them all
    return (f"{ran} of {fuzz['drawn']} drawn cases run within the {fuzz['budget_s']:g} s budget (the cost "
            f"model's estimate for all {fuzz['drawn']}: {fuzz['estimated_s']:g} s; checking took {fuzz['check_s']:.0f} "
            f"s), shrinking {fuzz['shrink_s']:.0f} s of its own bound of {fuzz['shrink_bound_s']:g} s")


def _shares_sizes(k: Knobs, smallest: Knobs) -> bool:
    """Whether `k` has each size a known failure's smallest case keeps above 2 (its head dim 80, its group of 3):
    else moving `k` there (`toward`) would plant that failure's trigger in it rather than find it there."""
    return all(size_of(k, name) == size_of(smallest, name) for name in SIZES if (size_of(smallest, name) or 0) > 2)


def summary_lines(run: FuzzRun) -> list[str]:
    """The terminal's fuzz summary: what was drawn, then each distinct failure once with its command."""
    lines = [f"fuzz: seed {run.seed}, {run_line(run.record())}: {len(run.failures)} distinct "
             f"failure{'s' * (len(run.failures) != 1)}"]
    for f in run.failures:
        stopped = f" (stopped by the {f.shrunk.stopped})" if f.shrunk.stopped else ""
        lines.append(f"FUZZ {f.check.status.upper()} {f.backend} {f.shrunk.case.spelled_id} [{f.check.phase}] "
                     f"{f.check.what}: {len(f.drawn)} of the {run.failing} failing drawn case"
                     f"{'s' * (run.failing != 1)} shrank to it; shrunk in "
                     f"{len(f.shrunk.steps)} steps, {f.shrunk.trials} trials{stopped}")
        lines.append(f"  {f.repro}")
    if run.unshrunk:
        lines.append(f"{run.unshrunk} more failing drawn cases were not shrunk (the {BOUND_S:g} s bound); their rows "
                     "in results.csv carry their own repro command")
    return lines

