"""Issue 65: the gate with power on a busy runner - seeded studies of the whole `compare --remeasure` decision (its
budget, its order, its backend-level verdicts) on the loaded and quiet machines of tests/fixtures/noise_models.py.

The issue's user: two backends (their kernel `tiled` and `naive`), 60 keys each, both runs made at load 6 on 2 CPUs
(so their own rounds decide nothing), `compare --remeasure` with its default budget. Targets: tiled 2x slower exits 1
in at least 9 of 10 seeds, unchanged code exits 1 in none of 20 (0 or 3); on a quiet machine 0 and 1.
"""

import pytest

from harness.compare.budget import sized_budget
from harness.compare.remeasure import RemeasureConfig, remeasure
from harness.compare.report import group_table, summary
from harness.measure.pooled import ALL_PHASES
from harness.compare.runs import EXIT_REGRESSION, compare_runs
from tests.fixtures.noise_models import LoadedMachine, Machine, Noise, FakeTimer, backends_run, synthetic_cases

#: a loaded run's own rounds: each round of a key offset by ~25 % (the load moving under it), heavy-tailed samples
LOADED_RUN = Noise(sigma=0.05, tail_df=2.5, round_sigma=0.25)
QUIET = Noise(sigma=0.03, tail_df=2.5)
#: the base run's benchmark stage: 3 rounds of 120 keys at ~1 s a key's round (what a timing costs the fake clock)
BENCHMARK_S = 360.0


class Clocked(FakeTimer):
    """A fake timer whose every timing advances the study's clock by `step` s (1 s: the base run's pace)."""

    def __init__(self, now: list, *args, step: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.now, self.step = now, step

    def time(self, *args):
        self.now[0] += self.step
        return super().time(*args)


def gate(tmp_path, seed: int, factor: float, machine: Machine, load: float | None,
         config: RemeasureConfig = RemeasureConfig(), step: float = 1.0):
    """One pair of runs and its `compare --remeasure` (default budget) on `machine`, each timing `step` s; the
    comparison and the log."""
    noise = LOADED_RUN if load else QUIET
    base = backends_run(tmp_path / f"base{seed}", seed, noise, load=load, benchmark_s=BENCHMARK_S)
    new = backends_run(tmp_path / f"new{seed}", 1000 + seed, noise, load=load, change={"tiled": factor})
    cmp = compare_runs(base, new)
    now, lines = [0.0], []
    new_timer = Clocked(now, {(c, "tiled"): factor for c in synthetic_cases()}, QUIET, seed + 1, machine, step=step)
    base_timer = Clocked(now, {}, QUIET, seed + 2, machine, step=step)
    remeasure(cmp, config, timer=new_timer, base_timer=base_timer, cases=synthetic_cases(),
              log=lines.append, clock=lambda: now[0], load=lambda: (load or 0.5, 2))
    return cmp, lines, now[0]


def test_under_load_a_2x_backend_fails_and_unchanged_code_never_does(tmp_path):
    slowed = [gate(tmp_path / "ab", s, 2.0, LoadedMachine(s, burst_p=0.3, shares=(0.75, 1.0)), 6.0)
              for s in range(10)]
    same = [gate(tmp_path / "aa", s, 1.0, LoadedMachine(100 + s, burst_p=0.3, shares=(0.75, 1.0)), 6.0)
            for s in range(20)]
    exits = [c.exit_code() for c, *_ in slowed]
    assert exits.count(EXIT_REGRESSION) >= 9, [c.remeasure_next for c, *_ in slowed]
    assert EXIT_REGRESSION not in [c.exit_code() for c, *_ in same], [group_table(c) for c, *_ in same]
    for cmp, lines, spent in slowed:
        assert spent <= 1.5 * BENCHMARK_S + 2  # within 1.5x the base run's benchmark stage (a pair may end past it)
        tiled = cmp.groups[(cmp.groups.backend == "tiled") & (cmp.groups.phase == ALL_PHASES)].iloc[0]
        assert tiled.verdict == "slower" and 1.7 < tiled.ratio < 2.35, tiled.note
        assert "tiled slower as a whole" in summary(cmp)
        assert "4 pairs of" in lines[0] and "capped at " in lines[0], lines[0]
        # naive's keys were timed too, and naive is never called slower
        assert "slower" not in set(cmp.groups[cmp.groups.backend == "naive"].verdict)
    # the pairs a burst unbalanced were not counted, and the log says how many and why
    assert any("not counted:" in line and "saturated" in line for _, lines, _ in slowed for line in lines)
    # every pair is on record with what the run saw of the machine, counted or not and why
    import pandas as pd
    pairs = pd.read_csv(slowed[0][0].new.run_dir / "remeasure" / "pairs.csv")
    assert len(pairs) > 100 and set(pairs.first) == {"base", "new"} and (pairs.load_average == 6.0).all()
    assert pairs.base_contention.between(0.75, 1.0).all() and not pairs.counted.all()
    assert pairs[~pairs.counted].why_not.str.startswith("saturated").all()


@pytest.mark.parametrize("seed", range(3))
def test_a_machine_slower_than_the_budget_was_sized_for_still_gets_a_second_round(tmp_path, seed):
    """Issue 65's first miss: the machine got busier after the budget was sized, and its first round took the whole
    budget - nothing is decided on one round. The first round stops at half the budget; a second follows."""
    machine = LoadedMachine(seed, burst_p=0.3, shares=(0.75, 1.0))
    cmp, lines, spent = gate(tmp_path, seed, 2.0, machine, 6.0, step=4.0)  # a pair 8 s: a round of 120 keys 960 s
    assert spent <= 1.5 * BENCHMARK_S + 8 and "2 round(s)" in lines[-1], lines[-1]
    assert cmp.exit_code() == EXIT_REGRESSION and "tiled slower as a whole" in summary(cmp)
    same, lines, _ = gate(tmp_path / "aa", seed, 1.0, LoadedMachine(100 + seed, burst_p=0.3, shares=(0.75, 1.0)),
                          6.0, step=4.0)
    assert same.exit_code() != EXIT_REGRESSION


@pytest.mark.parametrize("seed", range(3))
def test_on_a_quiet_machine_the_gate_is_as_before(tmp_path, seed):
    slowed, *_ = gate(tmp_path / "ab", seed, 2.0, Machine(seed, walk=0.02), None)
    same, *_ = gate(tmp_path / "aa", seed, 1.0, Machine(seed, walk=0.02), None)
    assert slowed.exit_code() == EXIT_REGRESSION and same.exit_code() in (0, 3)


def test_the_budget_goes_to_undecided_backends_first(tmp_path):
    """Once tiled is slower as a whole (two rounds that agree), its keys are timed no more: the rounds after go to
    naive's keys, until naive is settled too or its keys decide on their own."""
    cmp, lines, spent = gate(tmp_path, 0, 2.0, LoadedMachine(0, burst_p=0.3, shares=(0.75, 1.0)), 6.0,
                             RemeasureConfig(budget_s=3000))
    rows = cmp.rows[cmp.rows.remeasured.astype(bool)]
    tiled, naive = rows[rows.backend == "tiled"], rows[rows.backend == "naive"]
    assert tiled.note.str.contains("tiled is slower as a whole").all() and tiled.rounds_new.max() <= 2
    assert naive.rounds_new.max() > 2 and "slower" not in set(naive.verdict)


def test_the_default_budget_is_sized_from_the_base_run(tmp_path):
    base = backends_run(tmp_path / "base", 0, QUIET, benchmark_s=90.0)
    new = backends_run(tmp_path / "new", 1, QUIET, change={"tiled": 2.0})
    cmp = compare_runs(base, new)
    # 3 rounds of 120 keys in 90 s: 0.25 s a key's round; 4 pairs of 5 keys = 10 s -> the floor of 60 s
    assert sized_budget(cmp, 5, 4, None) == (60.0, "60 s: 4 pairs of 5 key(s) at 0.25 s a key's round in the base "
                                                   "run; at least 60 s")
    # twice as busy now as then: twice the time, within the benchmark stage
    budget, how = sized_budget(cmp, 20, 4, (4.0, 2))  # 4 pairs of 20 keys at 0.25 s, x2
    assert budget == 80.0 and "x2.0 for the load now" in how and "at least" not in how
    budget, how = sized_budget(cmp, 120, 4, None)  # two paired rounds of 120 keys: 120 s, within 1.5x of 90 s
    assert budget == 120.0 and "capped at two paired rounds of each (1.33x its benchmark stage of 90 s)" in how
    budget, how = sized_budget(cmp, 100, 4, (6.0, 2))  # x3 busier: two rounds 300 s, past 1.5x: 135 s
    assert budget == 135.0 and "(1.50x its benchmark stage of 90 s)" in how
    older = backends_run(tmp_path / "older", 0, QUIET)  # no time_spent: the former fixed budget, said so
    assert sized_budget(compare_runs(older, new), 5, 4, None)[0] == 120.0
