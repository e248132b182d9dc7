"""`compare --remeasure`: time the suspect keys of a gate again, base and new code in pairs, until each is decided."""

from __future__ import annotations

import os
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.compare.runs import Comparison, mark_regressions, samples_by_key
from harness.compare.timers import (CheckoutTimer, ExecutorTimer, KeyTimer, Rejected, code_mismatch, current_code,
                                    run_cases)
from harness.measure.paired import BUSY_LOAD_PER_CPU, pairs_needed, paired_verdict
from harness.measure.stats import FAMILY_ALPHA, gate_verdict
from harness.store.environment import REPO_ROOT
from harness.store.kernels import describe
from harness.store.run_dir import read_env
from harness.store.schema import FASTER, REJECTED, SLOWER, UNCHANGED, UNDECIDED
from harness.store.writer import SamplesWriter

REMEASURE_DIR = "remeasure"
SUSPECT = (SLOWER, UNDECIDED)
#: verdicts that end a key's re-measurement (undecided and not-timed go on)
DECIDED = (SLOWER, FASTER, UNCHANGED)


@dataclass(frozen=True)
class RemeasureConfig:
    """How long and how hard to re-measure (docs/regressions.md)."""

    budget_s: float = 120.0
    #: pairs before a key may pass as unchanged (one can fall inside a burst); slower needs pairs_needed(level)
    min_rounds: int = 4
    #: at most this many pairs, raised to pairs_needed + 4: a burst costs the bound a rank, more pairs buy it back
    max_rounds: int = 16
    seed: int = 0
    #: chance that any re-measured key of unchanged code is called slower (divided over the keys)
    family_alpha: float = FAMILY_ALPHA
    #: new worker processes every round; off: persistent ones showed no offset (gate_study.py part `process`)
    fresh_workers: bool = False

    def __post_init__(self):
        if not (self.budget_s > 0 and 2 <= self.min_rounds <= self.max_rounds and 0 < self.family_alpha < 0.5):
            raise ValueError(f"remeasure config {self}: needs budget_s > 0, 2 <= min_rounds <= max_rounds and "
                             "0 < family_alpha < 0.5")


def base_timer_for(comparison: Comparison, config: RemeasureConfig, base_checkout: str | Path | None,
                   base_python: str | None) -> tuple[KeyTimer | None, str]:
    """The timer of the base code and where it runs, or (None, why the base side cannot be timed again)."""
    base_dir = comparison.base.run_dir
    log_dir = comparison.new.run_dir / REMEASURE_DIR / "base-workers"
    if base_checkout is not None:
        timer = CheckoutTimer(Path(base_checkout), base_dir, log_dir, base_python, config.fresh_workers)
        return timer, f"the base code: {base_checkout}" + (f" ({timer.note})" if timer.note else "")
    env = read_env(base_dir)
    why = code_mismatch(env, current_code(), allow_dirty=False)
    if why is None and kernels_differ(env, read_env(comparison.new.run_dir)):
        # the runs timed different kernel sources: the base run's copies load in a process of their own (one
        # process cannot hold two modules registering one backend name)
        timer = CheckoutTimer(REPO_ROOT, base_dir, log_dir, None, config.fresh_workers)
        return timer, "the base code: this checkout, with the base run's kernels, in a process of its own"
    if why is None:
        return (ExecutorTimer(env, log_dir, config.fresh_workers, run_dir=base_dir),
                "the base code: this checkout (the base run's)")
    return None, (f"the base code is not here ({why}): only the new side is timed again, against the base run's "
                  "stored rounds; pass --base-checkout DIR (a checkout of the base commit) to time both in pairs")


def kernels_differ(base_env: dict, new_env: dict) -> bool:
    """Whether the two runs timed different kernel sources (a plugin changed between them)."""
    digests = [[r.get("sha256") for r in env.get("backend_sources") or []] for env in (base_env, new_env)]
    return digests[0] != digests[1]


def sources_note(base_env: dict, new_env: dict) -> str:
    """Which kernel source each side of a re-measurement ran ('' for a run of built-ins only)."""
    base, new = (env.get("backend_sources") or [] for env in (base_env, new_env))
    if not base and not new:
        return ""
    if not kernels_differ(base_env, new_env):
        return "kernel source unchanged: " + ", ".join(describe(r) for r in new)
    return (f"kernel sources: base {', '.join(describe(r) for r in base) or 'none'}, new "
            f"{', '.join(describe(r) for r in new) or 'none'}")


def _check_new_side(env: dict, run_dir: Path) -> str:
    """Re-measuring times the code checked out here: it must be the new run's. Returns a note (dirty tree)."""
    here = current_code()
    why = code_mismatch(env, here, allow_dirty=True)
    if why:
        raise ValueError(f"--remeasure times the code checked out here, but it is not the new run's {run_dir} "
                         f"({why}): check that out, or re-run the new side")
    return "uncommitted changes in the checkout: they are what is re-measured" if here["git_dirty"] else ""


def machine_load() -> tuple[float, int]:
    """This machine's 1-minute load average and CPU count (what the gate's noise guard reads every round)."""
    return os.getloadavg()[0], os.cpu_count() or 1


_AUTO = object()


def remeasure(comparison: Comparison, config: RemeasureConfig = RemeasureConfig(), *, log=print,
              timer: KeyTimer | None = None, base_timer=_AUTO, base_checkout: str | Path | None = None,
              base_python: str | None = None, cases: dict | None = None, clock=time.monotonic,
              load=machine_load) -> Comparison:
    """Re-time the suspect keys of `comparison` and re-decide their rows (`remeasured`, `first_verdict`, the note);
    fresh samples go to <new run>/remeasure/. `timer`, `base_timer` (None: the new side only), `cases`, `clock`
    and `load` (() -> (load average, CPUs); None: not read) are for tests."""
    if comparison.mode != "gate":
        raise ValueError("--remeasure needs a gate (both runs on one testbed), not a cross-device report")
    rows = comparison.rows
    suspects = rows[rows.verdict.isin(SUSPECT) & (rows.n_base > 0)]
    if suspects.empty:
        return comparison
    new_dir = comparison.new.run_dir
    env, out_dir = read_env(new_dir), new_dir / REMEASURE_DIR
    out_dir.mkdir(exist_ok=True)
    notes = [] if timer is not None else [_check_new_side(env, new_dir)]
    cases = run_cases(env, new_dir) if cases is None else cases

    pending = {}
    for row in suspects.itertuples():
        case = cases.get(row.case_id)
        if case is None:
            rows.loc[row.Index, "note"] = f"{row.note}; not re-measured: case not in the run's matrix".lstrip("; ")
            continue
        pending[row.Index] = (case, row.backend, row.phase, float(row.new_ms))
        rows.loc[row.Index, "first_verdict"] = row.verdict
    if not pending:
        return comparison
    timers: list = []
    try:
        if base_timer is _AUTO:
            base_timer, where = base_timer_for(comparison, config, base_checkout, base_python)
        else:
            where = "the base code: given" if base_timer is not None else "the new side only"
        timers.append(base_timer)
        timer = timer if timer is not None else ExecutorTimer(env, out_dir / "workers", config.fresh_workers,
                                                              run_dir=new_dir)
        timers.append(timer)
        log(f"re-measuring {len(pending)} key(s) of {new_dir} (budget {config.budget_s:.0f} s); "
            + "; ".join(filter(None, [where, *notes])))
        timed = list(pending)  # _rounds empties pending as keys are decided
        _rounds(comparison, config, pending, timer, base_timer, out_dir, log, clock, base_note=where, load=load)
        sources = sources_note(read_env(comparison.base.run_dir), env)
        for index in timed if sources else ():  # which kernel source each side ran
            rows.loc[index, "note"] = f"{rows.loc[index, 'note']}; {sources}"
    finally:
        for t in timers:
            if t is not None:
                t.close()
    mark_regressions(comparison)
    return comparison


def _rounds(comparison: Comparison, config: RemeasureConfig, pending: dict, timer, base_timer, out_dir: Path,
            log, clock, base_note: str, load=None) -> None:
    """The re-measurement loop: rounds of every pending key on both sides (or the new one), until decided."""
    rows = comparison.rows
    run_ids = {side: read_env(run.run_dir).get("run_id", run.run_dir.name)
               for side, run in (("new", comparison.new), ("base", comparison.base))}
    sides = {"base": base_timer, "new": timer} if base_timer is not None else {"new": timer}
    files = {"base": "base-samples.csv", "new": "samples.csv"}
    writers = {side: SamplesWriter(out_dir / files[side]) for side in sides}
    stored_base = samples_by_key(comparison.base.run_dir) if base_timer is None else {}
    alpha = config.family_alpha / len(pending)
    max_rounds = max(config.max_rounds, pairs_needed(alpha) + 4)
    fresh = {i: {side: [] for side in sides} for i in pending}  # per side: one list of samples per round
    order = random.Random(config.seed)
    start, rounds_done, loads, pairs_timed = clock(), 0, [], 0
    while pending and rounds_done < max_rounds and clock() - start < config.budget_s:
        for t in sides.values():
            t.start_round()
        try:
            keys = list(pending)
            order.shuffle(keys)  # a new order every round: a burst hits different keys' rounds
            for position, i in enumerate(keys):
                if clock() - start >= config.budget_s:
                    break
                case, backend, phase, estimate = pending[i]
                # ABBA: neither side is always the first of its pair
                names = list(sides)[::-1] if (rounds_done + position) % 2 else list(sides)
                got = {side: sides[side].time(case, backend, phase, estimate) for side in names}
                pairs_timed += 1
                rejected = [f"{side} code: {g.reason}" for side, g in got.items() if isinstance(g, Rejected)]
                failed = [f"{side}: {samples}" for side, samples in got.items() if isinstance(samples, str)]
                if rejected:  # no figure of this key is a re-measurement's: the gate says why, and fails
                    rows.loc[i, "verdict"], rows.loc[i, "remeasured"] = REJECTED, True
                    rows.loc[i, "note"] = (f"re-measure rejected (first verdict {rows.loc[i, 'first_verdict']}): "
                                           + "; ".join(rejected))
                elif failed:
                    rows.loc[i, "note"] = "re-measure failed: " + "; ".join(failed)
                if rejected or failed:
                    del pending[i]
                    continue
                for side, samples in got.items():
                    fresh[i][side].append(samples)
                    writers[side].write(run_ids[side], case.id, backend, phase, samples, rounds_done)
        finally:
            for t in sides.values():
                t.end_round()
        rounds_done += 1
        if load is not None:
            loads.append(load())
        during = (float(np.mean([a for a, _ in loads])), loads[-1][1]) if loads else None
        for i in list(pending):
            if len(fresh[i]["new"]) >= config.min_rounds and \
                    _decide(comparison, i, fresh[i], alpha, stored_base, base_note, during) in DECIDED:
                del pending[i]
    for i in pending:  # the budget ended: what the rounds say, but never a pass on fewer than min_rounds
        if fresh[i]["new"]:
            _decide(comparison, i, fresh[i], alpha, stored_base, base_note, during)
        if len(fresh[i]["new"]) < config.min_rounds:
            rows.loc[i, "verdict"] = UNDECIDED
            rows.loc[i, "note"] = (f"re-measure budget ended after {len(fresh[i]['new'])} round(s) of this key, "
                                   f"{config.min_rounds} needed: raise --remeasure-budget-s; "
                                   f"{rows.loc[i, 'note']}")
    if pending:
        comparison.remeasure_next = next_step(config, clock() - start, pairs_timed, rounds_done,
                                              {i: len(fresh[i]["new"]) for i in pending}, during,
                                              max_rounds if rounds_done >= max_rounds else None)
    log(f"re-measured in {clock() - start:.0f} s, {rounds_done} round(s)"
        + (f", load average {during[0]:.1f} on {during[1]} CPUs" if during else "") + "; "
        + (f"{len(pending)} key(s) still undecided" if pending else "every key decided"))


def next_step(config: RemeasureConfig, spent_s: float, pairs_timed: int, rounds_done: int, rounds_of: dict,
              load: tuple[float, int] | None, max_rounds: int | None = None) -> str:
    """What the undecided keys still need, never the command just run: more pairs when the pair limit stopped it
    (`max_rounds`), else the budget a decision would take at the pace measured (each undecided key's missing rounds
    x the seconds a key's pair took); then a quieter machine when it was loaded, then fewer keys."""
    per_pair = spent_s / pairs_timed if pairs_timed else math.nan
    missing = sum(max(config.min_rounds - n, 1) for n in rounds_of.values())
    need = missing * per_pair
    if max_rounds is not None:
        budget = (f"it stopped at --remeasure-max-pairs {max_rounds}: raise it (about {need:.0f} s more a round of "
                  "pairs at this pace)" if math.isfinite(need) else f"it stopped at --remeasure-max-pairs {max_rounds}")
    elif math.isfinite(need):
        budget = (f"a decision needs about {need:.0f} s more at the {per_pair:.2g} s a key's pair took here: "
                  f"--remeasure-budget-s {math.ceil(config.budget_s + need)}")
    else:
        budget = f"no key's pair was timed within --remeasure-budget-s {config.budget_s:g}: raise it"
    steps = [f"{len(rounds_of)} key(s) undecided after {rounds_done} round(s) in {spent_s:.0f} s of the "
             f"{config.budget_s:g} s budget; {budget}"]
    if load is not None and load[0] > BUSY_LOAD_PER_CPU * load[1]:
        steps.append(f"or a quieter machine (load average {load[0]:.1f} on {load[1]} CPUs while re-measuring)")
    steps.append("or fewer keys (--backends, or the keys' own run)")
    return ", ".join(steps)


def _decide(comparison: Comparison, index: int, fresh: dict, alpha: float, stored_base: dict, base_note: str,
            load: tuple[float, int] | None = None) -> str:
    """Re-decide one row on its fresh rounds (paired with fresh base rounds, else against the stored ones)."""
    rows = comparison.rows
    row = rows.loc[index]
    new_rounds = fresh["new"]
    if "base" in fresh:
        verdict = paired_verdict([np.median(s) for s in fresh["base"]], [np.median(s) for s in new_rounds],
                                 comparison.config, alpha=alpha, n_base=sum(map(len, fresh["base"])),
                                 n_new=sum(map(len, new_rounds)), load=load)
        how = f"{len(new_rounds)} paired rounds, base and new code interleaved"
    else:
        key = (row.case_id, row.backend, row.phase)
        b_ms, b_rounds = stored_base.get(key, ([], []))
        noise = None if comparison.noise is None else comparison.noise.key(key)
        n_ms = [x for s in new_rounds for x in s]
        n_rounds = [r for r, s in enumerate(new_rounds) for _ in s]
        busy = load is not None and load[0] > BUSY_LOAD_PER_CPU * load[1]
        verdict = gate_verdict(b_ms, n_ms, comparison.config, base_rounds=b_rounds, new_rounds=n_rounds, noise=noise,
                               loaded=f"load average {load[0]:.1f} on {load[1]} CPUs during re-measurement" if busy
                               else "")
        how = f"{len(new_rounds)} fresh rounds of the new code against the base run's ({base_note})"
    for column, value in verdict.columns().items():
        rows.loc[index, column] = value
    rows.loc[index, "verdict"] = verdict.verdict
    rows.loc[index, "remeasured"] = True
    rows.loc[index, "note"] = (f"re-measured: {how} (first verdict {row.first_verdict})"
                               + (f"; {verdict.note}" if verdict.note else ""))
    return verdict.verdict

