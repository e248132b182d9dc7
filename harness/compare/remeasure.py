"""`compare --remeasure`: time the suspect keys of a gate again, base and new code in pairs, until each is decided."""

from __future__ import annotations

import os
import math
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from harness.compare.budget import next_step, sized_budget
from harness.compare.groups import Groups
from harness.compare.runs import Comparison, mark_regressions, samples_by_key
from harness.compare.timers import (CheckoutTimer, ExecutorTimer, KeyTimer, Rejected, Unaudited, code_mismatch,
                                    current_code, kernels_differ, run_cases, sources_note)
from harness.measure.paired import BUSY_LOAD_PER_CPU, pairs_needed, paired_verdict
from harness.measure.pooled import GroupVerdict, pair_excluded, pair_log_ratios, scope
from harness.measure.stats import FAMILY_ALPHA, gate_verdict
from harness.store.environment import REPO_ROOT
from harness.store.run_dir import read_env
from harness.store.schema import FASTER, REJECTED, SLOWER, UNCHANGED, UNDECIDED
from harness.store.writer import PairsWriter, SamplesWriter

REMEASURE_DIR = "remeasure"
#: under REMEASURE_DIR: one line per pair (store.writer.PAIR_COLUMNS), counted or not and why
PAIRS_CSV = "pairs.csv"
SUSPECT = (SLOWER, UNDECIDED)
#: verdicts that end a key's re-measurement (undecided and not-timed go on)
DECIDED = (SLOWER, FASTER, UNCHANGED)
#: the share of the budget the first round may take (_rounds)
FIRST_ROUND_SHARE = 0.5


@dataclass(frozen=True)
class RemeasureConfig:
    """How long and how hard to re-measure (docs/regressions.md)."""

    #: None: sized from the base run's own round times and the load now (sized_budget)
    budget_s: float | None = None
    #: pairs before a key may pass as unchanged (one can fall inside a burst); slower needs pairs_needed(level)
    min_rounds: int = 4
    #: at most this many pairs, raised to pairs_needed + 4: a burst costs the bound a rank, more pairs buy it back
    max_rounds: int = 16
    seed: int = 0
    #: chance that any re-measured key of unchanged code is called slower (divided over the keys)
    family_alpha: float = FAMILY_ALPHA
    #: new worker processes every round; off: persistent ones showed no offset (gate_study.py part `process`)
    fresh_workers: bool = False
    #: stop re-measuring a key once its backend's verdict settles it (compare/groups.py); off: every key is timed
    #: until its own pairs decide it (the backends are still judged, and still fail the gate)
    settle_by_backend: bool = True

    def __post_init__(self):
        budget_ok = self.budget_s is None or self.budget_s > 0
        if not (budget_ok and 2 <= self.min_rounds <= self.max_rounds and 0 < self.family_alpha < 0.5):
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
        sized = ""
        if config.budget_s is None:
            budget, sized = sized_budget(comparison, len(pending), config.min_rounds, load() if load else None)
            config = replace(config, budget_s=budget)
        log(f"re-measuring {len(pending)} key(s) of {new_dir} (budget {sized or f'{config.budget_s:.0f} s'}); "
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


@dataclass
class _Key:
    """One key being re-measured: what it is, and per side one tuple of samples per counted pair."""

    case: object
    backend: str
    phase: str
    estimate_ms: float
    fresh: dict
    #: pairs timed but not counted, each with why (pooled.pair_excluded)
    excluded: list = field(default_factory=list)
    #: the round of each counted pair
    rounds: list = field(default_factory=list)
    #: which side goes first in this key's first pair (then it alternates): drawn per key, so that within a round
    #: half of each backend's keys have either order - its keys are pooled, and an order effect must not be a side's
    base_first: bool = True

    @property
    def pairs(self) -> int:
        return len(self.fresh["new"])

    def log_ratio(self, rounds: range | None = None) -> float:
        """Its counted pairs' median log ratio (pooled.pair_log_ratios: fastest samples, bursts left out; of the
        pairs of `rounds` only, when given); nan without a base side or such a pair. What its backend's verdict
        pools."""
        if "base" not in self.fresh:
            return math.nan
        ratios = [lr for lr, r in zip(pair_log_ratios(self.fresh["base"], self.fresh["new"]), self.rounds)
                  if lr is not None and (rounds is None or r in rounds)]
        return float(np.median(ratios)) if ratios else math.nan


def _rounds(comparison: Comparison, config: RemeasureConfig, pending: dict, timer, base_timer, out_dir: Path,
            log, clock, base_note: str, load=None) -> None:
    """The re-measurement loop: rounds of the pending keys on both sides (or the new one), ordered where a decision is
    closest, until each key or its backend is decided, the pairs run out or the budget does."""
    rows = comparison.rows
    run_ids = {side: read_env(run.run_dir).get("run_id", run.run_dir.name)
               for side, run in (("new", comparison.new), ("base", comparison.base))}
    sides = {"base": base_timer, "new": timer} if base_timer is not None else {"new": timer}
    files = {"base": "base-samples.csv", "new": "samples.csv"}
    writers = {side: SamplesWriter(out_dir / files[side]) for side in sides}
    pairs_csv = PairsWriter(out_dir / PAIRS_CSV) if base_timer is not None else None
    stored_base = samples_by_key(comparison.base.run_dir) if base_timer is None else {}
    alpha = config.family_alpha / len(pending)
    max_rounds = max(config.max_rounds, pairs_needed(alpha) + 4)
    shuffle = random.Random(config.seed)
    keys = {i: _Key(*pending[i], fresh={side: [] for side in sides}, base_first=shuffle.random() < 0.5)
            for i in pending}
    margin = 1 + comparison.config.min_effect
    # pooling a backend's keys needs pairs: runs minutes apart share no moment of the machine, and a drift between
    # them moves every key of every backend alike
    groups = Groups(keys, margin, config.family_alpha) if base_timer is not None else None
    start, rounds_done, loads, pairs_timed = clock(), 0, [], 0
    during = None
    while pending and rounds_done < max_rounds and clock() - start < config.budget_s:
        for t in sides.values():
            t.start_round()
        # nothing is decided on one round (a key needs min_rounds pairs, a backend two rounds that agree): the first
        # may take half the budget, so that a machine slower than the budget was sized for still gives a second
        # round - of the keys the first reached, which order() puts first
        ends = start + config.budget_s * (FIRST_ROUND_SHARE if rounds_done == 0 else 1.0)
        try:
            for i in order(keys, list(pending), alpha, config.min_rounds, margin, groups, shuffle):
                if clock() >= ends:
                    break
                k = keys[i]
                # ABBA: neither side is always the first of a key's pairs, nor of a round's
                flip = (k.pairs + len(k.excluded)) % 2 == k.base_first
                names = list(sides)[::-1] if flip else list(sides)
                got = {side: sides[side].time(k.case, k.backend, k.phase, k.estimate_ms) for side in names}
                pairs_timed += 1
                rejected = [f"{side} code: {g.reason}" for side, g in got.items() if isinstance(g, Rejected)]
                failed = [f"{side}: {g}" for side, g in got.items() if isinstance(g, str)]
                if rejected:  # no figure of this key is a re-measurement's: the gate says why, and fails
                    rows.loc[i, "verdict"], rows.loc[i, "remeasured"] = REJECTED, True
                    rows.loc[i, "note"] = (f"re-measure rejected (first verdict {rows.loc[i, 'first_verdict']}): "
                                           + "; ".join(rejected))
                elif failed:
                    rows.loc[i, "note"] = "re-measure failed: " + "; ".join(failed)
                if rejected or failed:
                    del pending[i], keys[i]
                    continue
                unaudited = [f"{side}: {g.reason}" for side, g in got.items() if isinstance(g, Unaudited)]
                if unaudited:  # the load's, not the kernel's: the pair does not count, the key goes on
                    k.excluded.append("unauditable: " + "; ".join(unaudited))
                    continue
                for side, timed in got.items():
                    writers[side].write(run_ids[side], k.case.id, k.backend, k.phase, timed.samples, rounds_done)
                why = pair_excluded(*(got[side].contention if side in got else None for side in ("base", "new")))
                if pairs_csv is not None:  # what the run saw of the machine around each side: the rule's inputs
                    pairs_csv.write(case_id=k.case.id, backend=k.backend, phase=k.phase, round=rounds_done,
                                    first=names[0], counted=not why, why_not=why,
                                    load_average=round(load()[0], 2) if load is not None else None,
                                    **{f"{side}_median_ms": float(np.median(got[side].samples)) for side in got},
                                    **{f"{side}_contention": got[side].contention for side in got})
                if why and "base" in got:
                    k.excluded.append(why)
                    continue
                for side, timed in got.items():
                    k.fresh[side].append(timed.samples)
                k.rounds.append(rounds_done)
        finally:
            for t in sides.values():
                t.end_round()
        rounds_done += 1
        if load is not None:
            loads.append(load())
        during = (float(np.mean([a for a, _ in loads])), loads[-1][1]) if loads else None
        for i in list(pending):
            if keys[i].pairs >= config.min_rounds and \
                    _decide(comparison, i, keys[i], alpha, stored_base, base_note, during) in DECIDED:
                del pending[i]
        if groups is not None:
            groups.look(rounds_done)
            for i in list(pending) if config.settle_by_backend else ():
                if (group := groups.settles(keys[i])) is not None:
                    _decide(comparison, i, keys[i], alpha, stored_base, base_note, during, group=group,
                            min_rounds=config.min_rounds)
                    del pending[i]
    for i in pending:  # the budget ended: what the rounds say, but never a pass on fewer than min_rounds
        k = keys[i]
        if k.pairs:
            _decide(comparison, i, k, alpha, stored_base, base_note, during)
        if k.pairs < config.min_rounds:
            rows.loc[i, "verdict"] = UNDECIDED
            rows.loc[i, "note"] = (f"re-measure ended after {k.pairs} counted pair(s) of this key, "
                                   f"{config.min_rounds} needed on its own; {rows.loc[i, 'note']}")
    if groups is not None:
        comparison.groups = groups.frame()
    spent = clock() - start
    if pending:
        comparison.remeasure_next = next_step(config.budget_s, config.min_rounds, spent, pairs_timed, rounds_done,
                                              {i: keys[i].pairs for i in pending}, during,
                                              max_rounds if rounds_done >= max_rounds else None,
                                              groups.undecided() if groups is not None else ())
    excluded = sum(len(k.excluded) for k in keys.values())
    log(f"re-measured in {spent:.0f} s, {rounds_done} round(s), {pairs_timed} pair(s)"
        + (f" ({excluded} not counted: {_why_excluded(keys)})" if excluded else "")
        + (f", load average {during[0]:.1f} on {during[1]} CPUs" if during else "") + "; "
        + (f"{len(pending)} key(s) still undecided" if pending else "every key decided")
        + (f"; backends: {groups.summary()}" if groups is not None and groups.verdicts else ""))


def _why_excluded(keys: dict) -> str:
    reasons = [why.split(":")[0] for k in keys.values() for why in k.excluded]
    return ", ".join(f"{n} {r}" for r, n in sorted(((r, reasons.count(r)) for r in set(reasons))))


def order(keys: dict, pending: list, alpha: float, min_rounds: int, margin: float, groups: Groups | None,
          shuffle: random.Random) -> list:
    """This round's keys: those of backends still undecided first, each backend's keys closest to their own decision
    first (fewest pairs still needed), the backends interleaved so that a budget ending mid-round leaves each with
    evidence; ties in a new random order every round (a burst hits different keys' rounds)."""
    shuffle.shuffle(pending)

    def still_needed(i) -> int:
        ratio = keys[i].log_ratio()
        beyond = math.isfinite(ratio) and abs(ratio) > math.log(margin)
        return max((pairs_needed(alpha) if beyond else min_rounds) - keys[i].pairs, 1)

    settled = {i: groups is not None and groups.settled(keys[i]) for i in pending}
    lanes: dict = {}
    for i in sorted(pending, key=lambda i: (settled[i], still_needed(i))):
        lanes.setdefault((settled[i], keys[i].backend), []).append(i)
    ordered = []
    for done in (False, True):
        queues = [q for (s, _), q in lanes.items() if s == done]
        while any(queues):
            for q in queues:
                if q:
                    ordered.append(q.pop(0))
    return ordered


def _decide(comparison: Comparison, index: int, key: _Key, alpha: float, stored_base: dict, base_note: str,
            load: tuple[float, int] | None = None, group: GroupVerdict | None = None, min_rounds: int = 0) -> str:
    """Re-decide one row on its fresh rounds (paired with fresh base rounds, else against the stored ones); `group`:
    the backend-level verdict that ended its re-measurement (a key within the margin of a backend unchanged as a
    whole is unchanged; one of a backend slower as a whole keeps its own verdict - but no pass on fewer than
    `min_rounds` pairs - and the gate fails on the group)."""
    rows = comparison.rows
    row = rows.loc[index]
    new_rounds = key.fresh["new"]
    excluded = (f"; {len(key.excluded)} pair(s) not counted ({'; '.join(sorted(set(key.excluded)))})"
                if key.excluded else "")
    if not new_rounds:
        verdict = None
        how = "no counted pair"
    elif "base" in key.fresh:
        verdict = paired_verdict([np.median(s) for s in key.fresh["base"]], [np.median(s) for s in new_rounds],
                                 comparison.config, alpha=alpha, n_base=sum(map(len, key.fresh["base"])),
                                 n_new=sum(map(len, new_rounds)), load=load)
        how = f"{len(new_rounds)} paired rounds, base and new code interleaved"
    else:
        k = (row.case_id, row.backend, row.phase)
        b_ms, b_rounds = stored_base.get(k, ([], []))
        noise = None if comparison.noise is None else comparison.noise.key(k)
        n_ms = [x for s in new_rounds for x in s]
        n_rounds = [r for r, s in enumerate(new_rounds) for _ in s]
        busy = load is not None and load[0] > BUSY_LOAD_PER_CPU * load[1]
        verdict = gate_verdict(b_ms, n_ms, comparison.config, base_rounds=b_rounds, new_rounds=n_rounds, noise=noise,
                               loaded=f"load average {load[0]:.1f} on {load[1]} CPUs during re-measurement" if busy
                               else "")
        how = f"{len(new_rounds)} fresh rounds of the new code against the base run's ({base_note})"
    outcome, note = (verdict.verdict, verdict.note) if verdict is not None else (UNDECIDED, "")
    if verdict is not None:
        for column, value in verdict.columns().items():
            rows.loc[index, column] = value
        if math.isnan(verdict.ratio) and new_rounds:  # one pair: no interval, still a figure
            rows.loc[index, "ratio"] = float(np.median(new_rounds[0]) / np.median(key.fresh["base"][0]))
            rows.loc[index, ["base_ms", "new_ms"]] = [float(np.median([np.median(s) for s in key.fresh[side]]))
                                                      for side in ("base", "new")]
    if group is not None:
        if group.verdict != SLOWER and outcome == UNDECIDED:
            outcome = UNCHANGED  # within the margin on its own pairs, and its backend's keys unchanged as a whole
        elif group.verdict == SLOWER and outcome in (UNCHANGED, FASTER) and len(new_rounds) < min_rounds:
            outcome = UNDECIDED
        note = (f"{note}; not re-measured further: {scope(group.backend, group.phase)} is {group.verdict} as a whole "
                f"({group.note})").lstrip("; ")
    rows.loc[index, "verdict"] = outcome
    rows.loc[index, "remeasured"] = True
    rows.loc[index, "note"] = (f"re-measured: {how} (first verdict {row.first_verdict}){excluded}"
                               + (f"; {note}" if note else ""))
    return outcome
