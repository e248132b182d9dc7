"""The re-measurement's budget: its default size from the base run, and what a decision would still need."""

from __future__ import annotations

import math

from harness.compare.runs import Comparison
from harness.measure.paired import BUSY_LOAD_PER_CPU
from harness.measure.pooled import GroupVerdict, scope
from harness.store.run_dir import read_env


def next_step(budget_s: float, min_rounds: int, spent_s: float, pairs_timed: int, rounds_done: int, rounds_of: dict,
              load: tuple[float, int] | None, max_rounds: int | None = None,
              groups: list[GroupVerdict] | tuple = ()) -> str:
    """What the undecided keys still need, never the command just run: more pairs when the pair limit stopped it
    (`max_rounds`), else the budget a decision would take at the pace measured (each undecided key's missing rounds
    x the seconds a key's pair took, or fewer where an undecided backend's keys would decide it together); then a
    quieter machine when it was loaded, then fewer keys."""
    per_pair = spent_s / pairs_timed if pairs_timed else math.nan
    missing = sum(max(min_rounds - n, 1) for n in rounds_of.values())
    by_group = sum(v.more_pairs for v in groups)
    need = min(missing, by_group) * per_pair if groups and math.isfinite(by_group) else missing * per_pair
    if max_rounds is not None:
        budget = (f"it stopped at --remeasure-max-pairs {max_rounds}: raise it (about {need:.0f} s more a round of "
                  "pairs at this pace)" if math.isfinite(need) else f"it stopped at --remeasure-max-pairs {max_rounds}")
    elif math.isfinite(need):
        budget = (f"a decision needs about {need:.0f} s more at the {per_pair:.2g} s a key's pair took here: "
                  f"--remeasure-budget-s {math.ceil(budget_s + need)}")
    else:
        budget = f"no key's pair was timed within --remeasure-budget-s {budget_s:g}: raise it"
    steps = [f"{len(rounds_of)} key(s) undecided after {rounds_done} round(s) in {spent_s:.0f} s of the "
             f"{budget_s:g} s budget; {budget}"]
    steps += [f"{scope(v.backend, v.phase)} undecided as a whole ({v.note})"
              + (f", about {v.more_pairs:.0f} more key-pair(s) would decide it" if math.isfinite(v.more_pairs) else "")
              for v in groups]
    if load is not None and load[0] > BUSY_LOAD_PER_CPU * load[1]:
        steps.append(f"or a quieter machine (load average {load[0]:.1f} on {load[1]} CPUs while re-measuring)")
    steps.append("or fewer keys (--backends, or the keys' own run)")
    return ", ".join(steps)


#: the budget when a run does not say how long its benchmark took (an older run, a synthetic one)
FALLBACK_BUDGET_S = 120.0
#: fewest seconds a sized budget gets, however short the base run's benchmark stage: a gate of a few keys pays worker
#: and server starts its base run did not, and a key decided on its own needs 6-9 pairs (CI's recipe of 3 keys, whose
#: benchmark stage took ~3 s, was left undecided by a budget of that size)
MIN_BUDGET_S = 60.0


#: the most a sized budget may exceed the base run's benchmark stage to give every suspect key two paired rounds: a
#: backend is decided on two rounds that agree (groups.rounds_agree), and two paired rounds of every key are four
#: rounds of it where the base run timed three
TWO_ROUNDS_SHARE = 1.5


def sized_budget(comparison: Comparison, suspects: int, min_rounds: int,
                 load: tuple[float, int] | None) -> tuple[float, str]:
    """(seconds, how) for --remeasure without --remeasure-budget-s: `min_rounds` pairs of each suspect key at what a
    key's round cost in the base run (its benchmark stage over its keys' rounds), scaled by how much busier the
    machine is now than when that run started; at most the base run's benchmark stage (~1x) - or what two paired
    rounds of every suspect take, up to TWO_ROUNDS_SHARE of it - and never under MIN_BUDGET_S."""
    env = read_env(comparison.base.run_dir)
    bench = ((env.get("time_spent") or {}).get("tests_s") or {}).get("benchmark")
    rows = comparison.rows
    key_rounds = float(rows.rounds_base.fillna(0).sum()) if "rounds_base" in rows else 0.0
    if not bench or key_rounds <= 0:
        return FALLBACK_BUDGET_S, f"{FALLBACK_BUDGET_S:.0f} s: the base run does not record its benchmark stage"
    per_round = bench / key_rounds
    then = ((env.get("clocks_start") or {}).get("loadavg") or [0])[0] / (env.get("cpu_count") or 1)
    now = load[0] / load[1] if load is not None else then
    busier = max(1.0, now) / max(1.0, then)
    per_pair = 2 * per_round * busier
    need, two = per_pair * suspects * min_rounds, per_pair * suspects * 2
    cap = max(bench, min(two, TWO_ROUNDS_SHARE * bench))
    budget = max(min(cap, need), MIN_BUDGET_S)
    capped = ("" if need <= cap else f" = {need:.0f} s, capped at " + (
        f"its benchmark stage ({bench:.0f} s)" if cap == bench else
        f"two paired rounds of each ({cap / bench:.2f}x its benchmark stage of {bench:.0f} s)"))
    floor = f"; at least {MIN_BUDGET_S:.0f} s" if min(cap, need) < MIN_BUDGET_S else ""
    return budget, (f"{budget:.0f} s: {min_rounds} pairs of {suspects} key(s) at {per_round:.2g} s a key's round in "
                    f"the base run" + (f", x{busier:.1f} for the load now" if busier > 1 else "") + capped + floor)
