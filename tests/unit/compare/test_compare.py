"""compare, the regression gate: verdicts on synthetic runs from seeded noise models (exact expected outcomes),
correctness changes, missing keys, the testbed check, exit codes and outputs. No real timing here: the
real-timing study is benchmarks/gate_study.py."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from harness.cli.main import build_parser, main
from harness.compare.runs import EXIT_OK, EXIT_REGRESSION, EXIT_UNDECIDED, MismatchedTestbeds, compare_runs, \
    run_warnings
from harness.measure import stats
from harness.measure.stats import GateConfig, KeyNoise, _u_counts, gate_verdict, shift_interval
from harness.store.schema import TIMING_VERDICTS
from tests.fixtures.noise_models import FakeTimer, Noise, synthetic_cases, synthetic_run
from tests.fixtures.regress_fixtures import key, lognormal, write_run

ROOT = Path(__file__).resolve().parents[3]
#: everything this VM was seen to do at once: heavy tails, a 2 % drift, one round 1.5x slow, a whole run 5 % slow
BURSTY = Noise(sigma=0.03, tail_df=2.5, round_sigma=0.01, drift=0.02, slow_round=1, run_factor=1.05)


def harness(capsys, *args):
    """`python -m harness ARGS` in this process (the CLI path of test_cli, without a second torch import)."""
    code = main(list(args))
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


def verdicts(comparison) -> dict[str, int]:
    return comparison.rows.verdict.value_counts().to_dict()


def row(comparison, k):
    return comparison.rows.set_index(["case_id", "backend", "phase"]).loc[k]


@pytest.mark.parametrize("seed", range(5))
def test_unchanged_code_on_a_bursty_machine_is_unchanged(tmp_path, seed):
    base = synthetic_run(tmp_path / "base", seed, Noise(sigma=0.03, tail_df=2.5, drift=0.02))
    # heavy tails, drift, one round 1.5x slow: the rounds' Hodges-Lehmann shift shrugs off the slow round
    new = synthetic_run(tmp_path / "new", 100 + seed, Noise(sigma=0.03, tail_df=2.5, drift=0.02, slow_round=1))
    cmp = compare_runs(base, new)
    assert verdicts(cmp) == {"unchanged": 30} and cmp.exit_code() == EXIT_OK


@pytest.mark.parametrize("seed", range(5))
def test_a_slow_run_is_flagged_at_most_at_the_margin_and_refuted_by_re_measurement(tmp_path, seed):
    """A whole run 5 % slow on top of everything else puts a key's ratio at the 10 % margin now and then; the
    re-measured rounds (this machine, not that run's moment) decide it."""
    from harness.compare.remeasure import RemeasureConfig, remeasure
    base = synthetic_run(tmp_path / "base", seed, Noise(sigma=0.03, tail_df=2.5, drift=0.02))
    new = synthetic_run(tmp_path / "new", 100 + seed, BURSTY)
    cmp = compare_runs(base, new)
    flagged = cmp.rows[cmp.rows.verdict != "unchanged"]
    assert set(flagged.verdict) <= {"slower", "undecided"} and len(flagged) <= 2
    assert (flagged.ratio < 1.15).all()
    remeasure(cmp, RemeasureConfig(budget_s=600), load=None, timer=FakeTimer({}, Noise(sigma=0.03, tail_df=2.5)),
              cases=synthetic_cases(), log=lambda *_: None, base_timer=None)
    assert verdicts(cmp) == {"unchanged": 30} and cmp.exit_code() == EXIT_OK


@pytest.mark.parametrize("seed", range(5))
def test_twice_the_work_is_slower_for_every_key(tmp_path, seed):
    """With enough rounds for the family-wise level (30 keys: 6 or more a side), slower; with the default 3 rounds a
    side no interval reaches it, so every key is undecided - never unchanged - and --remeasure decides."""
    base = synthetic_run(tmp_path / "base", seed, BURSTY, rounds=8)
    new = synthetic_run(tmp_path / "new", 100 + seed, BURSTY, change=2.0, rounds=8)
    cmp = compare_runs(base, new)
    assert verdicts(cmp) == {"slower": 30} and cmp.exit_code() == EXIT_REGRESSION
    assert (cmp.rows.ratio.between(1.8, 2.2)).all() and (cmp.rows.ratio_low > 1).all()
    cmp = compare_runs(synthetic_run(tmp_path / "base3", seed, BURSTY),
                       synthetic_run(tmp_path / "new3", 100 + seed, BURSTY, change=2.0))
    assert verdicts(cmp) == {"undecided": 30} and cmp.exit_code() == EXIT_UNDECIDED
    assert cmp.key_confidence == pytest.approx(1 - 2 * stats.FAMILY_ALPHA / 30)
    assert cmp.rows.note.str.contains("too few rounds for any interval at this confidence: compare --remeasure").all()


def test_a_key_at_the_margin_is_not_beyond_it():
    """compare printed 'ratio 1.100 against margin 1.100' and called it a regression (issue 48)."""
    assert not stats.counts_as_change(1.0, 1.1004, 1.1004, 1.1) and stats.counts_as_change(1.0, 1.1006, 1.1006, 1.1)
    assert not stats.counts_as_change(1.1004, 1.0, 1 / 1.1004, 1.1)


@pytest.mark.parametrize("seed", range(20))
def test_unchanged_code_never_fails_plain_compare_over_73_keys(tmp_path, seed):
    """20 A/A pairs of 73 keys at 3 rounds under the bursty noise: no pair exits 1 (each key was tested at 90 %,
    so a false 'slower' was likely on every pair)."""
    base = synthetic_run(tmp_path / "base", seed, BURSTY, n_keys=73)
    new = synthetic_run(tmp_path / "new", 1000 + seed, BURSTY, n_keys=73)
    assert compare_runs(base, new).exit_code() != EXIT_REGRESSION


def test_a_quarter_slower_is_caught_unless_a_burst_hides_it_in_the_base(tmp_path):
    quiet = Noise(sigma=0.03, tail_df=2.5, drift=0.02)
    base = synthetic_run(tmp_path / "base", 1, quiet, rounds=8)
    new = synthetic_run(tmp_path / "new", 2, BURSTY, change=1.25, rounds=8)
    assert verdicts(compare_runs(base, new)) == {"slower": 30}
    # the slow round in the *base* run: its 1.5x round overlaps the new rounds, so 3 vs 3 rounds cannot
    # establish the change - undecided (exit 3), never passed
    bursty_base = synthetic_run(tmp_path / "base2", 1, BURSTY)
    cmp = compare_runs(bursty_base, synthetic_run(tmp_path / "new2", 2, quiet, change=1.25 * 1.05))
    assert verdicts(cmp) == {"undecided": 30} and cmp.exit_code() == EXIT_UNDECIDED
    assert cmp.exit_code(fail_on_undecided=False) == EXIT_OK
    assert "(99.67% interval" in cmp.rows.note.iloc[0] and "too few rounds" in cmp.rows.note.iloc[0]


def test_a_whole_run_burst_on_one_key_is_flagged_then_refuted_by_re_measurement(tmp_path):
    """The burst that made the old gate flaky: one key 1.5x slow in all three rounds of one run. The base run's
    commit is not this checkout's, so only the new side is timed again (the fallback; pairs: test_remeasure)."""
    base = synthetic_run(tmp_path / "base", 1, Noise())
    new = synthetic_run(tmp_path / "new", 2, Noise(), change={7: 1.5})
    cmp = compare_runs(base, new)
    assert verdicts(cmp) == {"unchanged": 29, "undecided": 1} and row(cmp, key(7)).verdict == "undecided"
    from harness.compare.remeasure import RemeasureConfig, remeasure
    timer = FakeTimer({key(7)[0]: 1.0}, Noise())  # the burst is gone when re-timed
    remeasure(cmp, RemeasureConfig(budget_s=60), load=None, timer=timer, cases=synthetic_cases(), log=lambda *_: None, base_timer=None)
    r = row(cmp, key(7))
    assert (r.verdict, r.first_verdict, bool(r.remeasured), r.rounds_new) == ("unchanged", "undecided", True, 4)
    assert cmp.exit_code() == EXIT_OK and timer.rounds == 4 and timer.closed
    assert len(pd.read_csv(new / "remeasure" / "samples.csv")) == 4 * 20
    assert "against the base run's" in r.note  # the base code (another commit) was not here: new side only


def test_a_real_regression_is_confirmed_by_re_measurement(tmp_path):
    base = synthetic_run(tmp_path / "base", 1, Noise(sigma=0.03, tail_df=2.5, drift=0.02))
    new = synthetic_run(tmp_path / "new", 2, Noise(), change={3: 1.3, 9: 2.0})
    cmp = compare_runs(base, new)
    from harness.compare.remeasure import RemeasureConfig, remeasure
    suspects = set(cmp.rows[cmp.rows.verdict.isin(["slower", "undecided"])].case_id)
    assert {key(3)[0], key(9)[0]} <= suspects
    remeasure(cmp, RemeasureConfig(budget_s=600), load=None, timer=FakeTimer({key(3)[0]: 1.3, key(9)[0]: 2.0}, Noise()),
              cases=synthetic_cases(), log=lambda *_: None, base_timer=None)
    assert row(cmp, key(3)).verdict == "slower" and row(cmp, key(9)).verdict == "slower"
    assert cmp.exit_code() == EXIT_REGRESSION


def test_re_measurement_stops_at_its_budget(tmp_path):
    base = synthetic_run(tmp_path / "base", 1, Noise())
    new = synthetic_run(tmp_path / "new", 2, Noise(), change={k: 1.5 for k in range(10)})
    cmp = compare_runs(base, new)
    from harness.compare.remeasure import RemeasureConfig, remeasure
    ticks = iter(range(0, 10_000, 7))  # every key timing takes 7 s of a 30 s budget
    timer = FakeTimer({key(k)[0]: 1.5 for k in range(10)}, Noise())
    remeasure(cmp, RemeasureConfig(budget_s=30), load=None, timer=timer, cases=synthetic_cases(), clock=lambda: next(ticks),
              log=lambda *_: None, base_timer=None)
    assert timer.calls <= 5 and cmp.rows.remeasured.sum() <= 5


def test_the_noise_model_sets_each_keys_margin():
    base = [lognormal(seed=i, n=20, sigma=0.01) for i in range(3)]
    new = [b * 1.2 for b in [lognormal(seed=10 + i, n=20, sigma=0.01) for i in range(3)]]
    rounds = dict(base_rounds=np.repeat([0, 1, 2], 20), new_rounds=np.repeat([0, 1, 2], 20))
    flat = (np.concatenate(base), np.concatenate(new))
    assert gate_verdict(*flat, **rounds).verdict == "slower"
    noisy = KeyNoise(aa_sigma=0.08, runs=10)  # this key moves 8 % between runs of unchanged code
    v = gate_verdict(*flat, **rounds, noise=noisy)
    assert v.verdict == "unchanged" and v.margin == pytest.approx(np.exp(3 * 0.08))
    quiet = KeyNoise(aa_sigma=0.001, runs=10)  # never below --min-effect
    assert gate_verdict(*flat, **rounds, noise=quiet).margin == pytest.approx(1.10)


def test_mann_whitney_null_counts_by_brute_force():
    """The exact null distribution of U (how many (x, y) pairs have y < x) by enumerating every ordering."""
    from itertools import combinations
    for m, n in [(1, 1), (2, 3), (3, 3), (3, 5), (4, 4)]:
        counts = [0] * (m * n + 1)
        for x_positions in combinations(range(m + n), m):
            u = sum(sum(1 for p in range(x) if p not in x_positions) for x in x_positions)
            counts[u] += 1
        assert tuple(counts) == _u_counts(m, n)


def test_interval_is_the_order_statistics_of_pairwise_differences():
    x, y = np.log([1.0, 1.02, 0.99]), np.log([2.0, 2.05, 1.97])
    shift, low, high, exact = shift_interval(x, y, 0.90)
    diffs = np.sort(np.subtract.outer(y, x).ravel())
    assert exact and (shift, low, high) == (np.median(diffs), diffs[0], diffs[-1])  # 3 vs 3: the extremes
    assert not shift_interval(x[:2], y, 0.90)[3]  # 2 vs 3 rounds: no 90 % interval exists
    assert gate_verdict([1.0, 1.0], [2.0, 2.0], base_rounds=[0, 1], new_rounds=[0, 1]).verdict == "undecided"


@pytest.mark.parametrize("base_extra, new_extra, expected, needle", [
    ({}, {"status": "fail", "reason": "out: err 3e-2 > tol 1e-3", "err_ratio": 30.0}, "worse", "pass->fail"),
    ({}, {"status": "error", "reason": "RuntimeError: boom"}, "worse", "pass->error: RuntimeError: boom"),
    ({}, {"nonfinite": True}, "worse", "new non-finite values"),
    ({"err_ratio": 0.1}, {"err_ratio": 0.5}, "worse", "err_ratio 0.1->0.5"),
    ({"err_ratio": 0.1}, {"err_ratio": 0.2}, "same", ""),
    ({}, {"status": "unavailable", "reason": "xformers not importable"}, "lost", "pass->unavailable"),
    ({"status": "fail", "reason": "x"}, {}, "better", "fail->pass"),
])
def test_correctness_changes(tmp_path, base_extra, new_extra, expected, needle):
    k, other = key(2), key(3)
    samples = {k: lognormal(1), other: lognormal(2)}
    base = write_run(tmp_path / "b", {k: base_extra, other: {}}, samples)
    new = write_run(tmp_path / "n", {k: new_extra, other: {}}, samples)
    cmp = compare_runs(base, new)
    r = row(cmp, k)
    assert r.correctness == expected and needle in r.note
    assert r.regression == (expected in ("worse", "lost"))
    assert cmp.rows.regression.sum() == (expected in ("worse", "lost"))


def test_missing_keys_and_an_empty_run_fail_the_gate(tmp_path, capsys):
    base = synthetic_run(tmp_path / "base", 1, Noise())
    partial = synthetic_run(tmp_path / "partial", 2, Noise(), drop=(4, 5))
    cmp = compare_runs(base, partial)
    assert verdicts(cmp) == {"unchanged": 28, "missing": 2} and cmp.exit_code() == EXIT_REGRESSION
    res = harness(capsys, "compare", str(base), str(partial))
    assert res.returncode == 1 and "REGRESSION: 2 row(s)" in res.stdout and "missing" in res.stdout
    res = harness(capsys, "compare", str(base), str(partial), "--allow-missing", "--out", str(tmp_path / "o"))
    assert res.returncode == 0, res.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "results.csv").write_text((partial / "results.csv").read_text().splitlines()[0] + "\n")
    (empty / "env.json").write_text((partial / "env.json").read_text())
    res = harness(capsys, "compare", str(base), str(empty))
    assert res.returncode == 1 and "REGRESSION: 30 row(s)" in res.stdout and "the new run has no rows" in res.stdout


def test_rows_only_in_the_new_run_are_listed_not_gating(tmp_path):
    a, c = key(0), key(2, phase="bwd")
    base = write_run(tmp_path / "b", {a: {}}, {a: lognormal(1)})
    new = write_run(tmp_path / "n", {a: {}, c: {}}, {a: lognormal(3), c: lognormal(4)})
    cmp = compare_runs(base, new)
    assert row(cmp, c).verdict == "new-only" and cmp.exit_code() == EXIT_OK


def test_different_testbeds_refused_without_cross_device(tmp_path):
    base = synthetic_run(tmp_path / "base", 1, Noise())
    new = synthetic_run(tmp_path / "new", 2, Noise(), change={0: 1.5}, testbed="tb-gpu-h100",
                        device_name="NVIDIA H100 80GB HBM3")
    refused = r"different testbeds.*'tb-cpu-a'.*'tb-gpu-h100'.*device_name.*--cross-device"
    with pytest.raises(MismatchedTestbeds, match=refused):
        compare_runs(base, new)
    cmp = compare_runs(base, new, cross_device=True)
    assert cmp.mode == "cross-device" and row(cmp, key(0)).verdict == "slower" and not cmp.regression
    assert cmp.exit_code() == EXIT_OK


def test_busy_or_throttled_runs_are_warned_about(tmp_path, capsys):
    base = synthetic_run(tmp_path / "base", 1, Noise())
    new = synthetic_run(tmp_path / "new", 2, Noise())
    env = json.loads((new / "env.json").read_text())
    env.update(cpu_count=2, clocks_start={"loadavg": [5.2, 4.0, 3.0]}, clocks_end={"throttle_reasons": "0x4"})
    (new / "env.json").write_text(json.dumps(env))
    quiet = {"cpu_count": 2, "clocks_start": {"loadavg": [1.5]}, "clocks_end": {"throttle_reasons": "0x1"}}
    assert run_warnings(quiet) == []
    assert compare_runs(base, new).warnings == [
        "new run: start: load average 5.2 on 2 CPUs (other processes competed for them)",
        "new run: end: GPU clock throttle reasons 0x4"]
    res = harness(capsys, "compare", str(base), str(new))
    assert res.returncode == 0 and "WARNING new run: start: load average 5.2" in res.stdout


def test_one_change_rule_and_one_word_for_the_gate_the_history_and_the_advisor():
    """measure/stats.py decides every timing verdict: one rule for 'beyond the margin', one vocabulary, and each
    minimum effect defined once - MIN_RUN_CHANGE between runs, MIN_BACKEND_DIFFERENCE between backends of a run."""
    from harness.advisor.ranking import ADVISOR_WORDS, TIE_VERDICTS
    from harness.history.changes import detect_changes

    assert stats.counts_as_change(1.0, 1.11, 1.11, 1.1) and stats.counts_as_change(1.11, 1.0, 1 / 1.11, 1.1)
    assert not stats.counts_as_change(1.0, 1.09, 1.09, 1.1)
    assert not stats.counts_as_change(1.0, 1 / 1.09, 1 / 1.09, 1.1)
    assert not stats.counts_as_change(0.0005, 0.001, 2.0, 1.1, abs_floor_ms=stats.ABS_FLOOR_MS)  # below the floor
    flat, moved = [1.0] * 20, [1.2] * 20
    assert gate_verdict(flat, moved, base_rounds=[0] * 20, new_rounds=[0] * 20).verdict == "undecided"
    assert stats.timing_verdict(flat[:5], moved[:5]).verdict == "undecided"  # the advisor's word is the gate's
    assert set(TIE_VERDICTS) | set(ADVISOR_WORDS) <= set(TIMING_VERDICTS)
    defaults = {name: sub.get_default("min_effect") for name, sub in next(
        a for a in build_parser()._actions if a.dest == "command").choices.items() if name in ("compare", "history")}
    assert defaults == {"compare": stats.MIN_RUN_CHANGE, "history": stats.MIN_RUN_CHANGE}
    assert GateConfig().min_effect == detect_changes.__kwdefaults__["min_effect"] == stats.MIN_RUN_CHANGE == 0.10
    assert stats.TieConfig().min_effect == stats.MIN_BACKEND_DIFFERENCE == 0.05


def test_bad_thresholds_are_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match="confidence=1.5"):
        GateConfig(confidence=1.5)
    with pytest.raises(ValueError, match="min_effect=-0.1"):
        GateConfig(min_effect=-0.1)
    res = harness(capsys, "compare", "a", "b", "--confidence", "nan")
    assert res.returncode == 2 and "--confidence" in res.stderr


def test_cli_exit_codes_and_outputs(tmp_path, capsys):
    base = synthetic_run(tmp_path / "base", 1, Noise())
    base = synthetic_run(tmp_path / "base8", 1, Noise(), rounds=8)
    slow = synthetic_run(tmp_path / "slow", 2, Noise(), change={4: 1.5}, rounds=8)
    out = tmp_path / "report"
    res = harness(capsys, "compare", str(base), str(slow), "--out", str(out))
    assert res.returncode == 1, res.stdout + res.stderr
    line = next(ln for ln in res.stdout.splitlines() if key(4)[0] in ln)
    assert "slower" in line and "1.5" in line and "8/8" in line  # verdict, ratio, interval and rounds
    assert "REGRESSION: 1 row(s)" in res.stdout
    csv = pd.read_csv(out / "compare.csv")
    assert len(csv) == 30 and csv.regression.sum() == 1
    assert "| slower |" in (out / "compare.md").read_text()
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # one key's new rounds 1.6x, 0.95x, 1.7x: beyond the margin, but one round says no change
    rounds = {k: [lognormal(seed=10 * i + r, n=20, sigma=0.01) for r in range(3)] for i, k in
              enumerate(key(i) for i in range(5))}
    base = write_run(tmp_path / "b5", {k: {} for k in rounds}, rounds)
    moved = {**rounds, key(4): [r * f for r, f in zip(rounds[key(4)], (1.6, 0.95, 1.7))]}
    undecided = write_run(tmp_path / "undecided", {k: {} for k in moved}, moved)
    res = harness(capsys, "compare", str(base), str(undecided))
    assert res.returncode == 3 and "undecided:" in res.stdout and "--remeasure" in res.stdout, res.stdout
    res = harness(capsys, "compare", str(base), str(undecided), "--no-fail-on-undecided")
    assert res.returncode == 0

    base = synthetic_run(tmp_path / "base30", 1, Noise())
    same = synthetic_run(tmp_path / "same", 4, Noise())
    res = harness(capsys, "compare", str(base), str(same))
    assert res.returncode == 0 and "no regression" in res.stdout, res.stdout
    assert (same / "compare-vs-base30" / "compare.csv").exists()


def test_cli_testbed_mismatch_is_an_error_unless_cross_device(tmp_path, capsys):
    base = synthetic_run(tmp_path / "base", 1, Noise())
    new = synthetic_run(tmp_path / "new", 2, Noise(), testbed="tb-other")
    res = harness(capsys, "compare", str(base), str(new))
    assert res.returncode == 2 and "different testbeds" in res.stderr and "--cross-device" in res.stderr
    res = harness(capsys, "compare", str(base), str(new), "--cross-device", "--out", str(tmp_path / "x"))
    assert res.returncode == 0 and "not a regression gate" in res.stdout, res.stdout + res.stderr
