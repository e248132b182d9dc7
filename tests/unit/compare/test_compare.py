"""compare: timing verdicts from raw samples, correctness changes, testbed gate, CLI outputs and exit codes."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy.stats import mannwhitneyu

from harness.cli.main import main
from harness.compare.runs import Comparison, MismatchedTestbeds, compare_runs, run_warnings
from harness.measure.stats import ALPHA, CompareConfig, min_attainable_p
from tests.fixtures.regress_fixtures import key, lognormal, write_run

ROOT = Path(__file__).resolve().parents[3]
N_KEYS = 40


def harness(capsys, *args):
    """`python -m harness ARGS` in this process (the CLI path of test_cli, without a second torch import)."""
    code = main(list(args))
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


def pair(tmp_path, new_samples=None, new_rows=None, base_rows=None, **new_env):
    """A base run of N_KEYS keys and a new run from the same distribution unless overridden per key."""
    keys = [key(i) for i in range(N_KEYS)]
    base_s = {k: lognormal(seed=i) for i, k in enumerate(keys)}
    new_s = {k: lognormal(seed=1000 + i) for i, k in enumerate(keys)}
    new_s.update(new_samples or {})
    base = write_run(tmp_path / "base", {k: (base_rows or {}).get(k, {}) for k in keys}, base_s)
    new = write_run(tmp_path / "new", {k: (new_rows or {}).get(k, {}) for k in keys}, new_s, **new_env)
    return base, new


def compare(base, new, *, cross_device=False, **thresholds) -> Comparison:
    return compare_runs(base, new, CompareConfig(**thresholds), cross_device=cross_device)


def row(comparison: Comparison, k):
    return comparison.rows.set_index(["case_id", "backend", "phase"]).loc[k]


def test_identical_distributions_no_regression(tmp_path):
    df = compare(*pair(tmp_path))
    assert len(df.rows) == N_KEYS
    assert set(df.rows.verdict) == {"unchanged"}, df.rows.verdict.value_counts()
    assert set(df.rows.correctness) == {"same"}
    assert not df.regression
    assert df.mode == "gate"


def test_twenty_percent_slowdown_flagged_with_p_and_ratio(tmp_path):
    slow, fast = key(3), key(7)
    df = compare(*pair(tmp_path, {slow: lognormal(seed=3003) * 1.2, fast: lognormal(seed=3007) * 0.8}))
    r = row(df, slow)
    assert r.verdict == "slower" and r.regression
    assert r.p_value < ALPHA and r.ratio == pytest.approx(1.2, rel=0.03)
    f = row(df, fast)
    assert f.verdict == "faster" and not f.regression and f.ratio == pytest.approx(0.8, rel=0.03)
    assert df.rows.regression.sum() == 1 and df.regression


def test_small_shift_is_significant_but_below_min_effect(tmp_path):
    k = key(5)
    base = write_run(tmp_path / "b", {k: {}}, {k: lognormal(seed=5, n=400, sigma=0.01)})
    new = write_run(tmp_path / "n", {k: {}}, {k: lognormal(seed=6, n=400, sigma=0.01) * 1.03})
    r = row(compare(base, new), k)
    assert r.p_value < 1e-10  # the rank test alone would call a 3% shift a regression
    assert r.verdict == "unchanged" and not r.regression
    assert row(compare(base, new, min_effect=0.02), k).verdict == "slower"  # threshold is configurable


def test_absolute_floor(tmp_path):
    k = key(1)
    base = write_run(tmp_path / "b", {k: {}}, {k: lognormal(seed=1, median_ms=0.0004)})
    new = write_run(tmp_path / "n", {k: {}}, {k: lognormal(seed=2, median_ms=0.0004) * 1.5})
    assert row(compare(base, new), k).verdict == "unchanged"  # 0.2 us: below the 1 us floor
    assert row(compare(base, new, abs_floor_ms=0.0001), k).verdict == "slower"


def test_inconclusive_with_too_few_samples(tmp_path):
    k = key(0)
    base = write_run(tmp_path / "b", {k: {}}, {k: lognormal(seed=1, n=5)})
    new = write_run(tmp_path / "n", {k: {}}, {k: lognormal(seed=2, n=5) * 2.0})
    r = row(compare(base, new), k)
    assert r.verdict == "inconclusive" and not r.regression
    assert "too few samples (5 vs 5;" in r.note and r.ratio > 1.8


def test_inconclusive_below_min_samples_even_when_p_is_tiny(tmp_path):
    # 8 samples against 400: exact p can be ~1e-15, but 8 back-to-back samples can sit in one transient
    k = key(0)
    base = write_run(tmp_path / "b", {k: {}}, {k: lognormal(seed=1, n=400)})
    new = write_run(tmp_path / "n", {k: {}}, {k: lognormal(seed=2, n=8) * 3.0})
    r = row(compare(base, new), k)
    assert r.verdict == "inconclusive" and r.p_value < 1e-6 and "need >= 10 per side" in r.note
    assert row(compare(base, new, min_samples=5), k).verdict == "slower"


def test_inconclusive_when_noisy(tmp_path):
    k = key(0)
    base = write_run(tmp_path / "b", {k: {}}, {k: lognormal(seed=11, n=12, sigma=0.8)})
    new = write_run(tmp_path / "n", {k: {}}, {k: lognormal(seed=12, n=12, sigma=0.8) * 1.3})
    r = row(compare(base, new), k)
    assert r.verdict == "inconclusive" and r.p_value >= ALPHA and "too noisy" in r.note


def test_no_samples_is_not_timed_and_one_sided_samples_inconclusive(tmp_path):
    a, b = key(0), key(1)
    base = write_run(tmp_path / "b", {a: {}, b: {}}, {b: lognormal(seed=1)})
    new = write_run(tmp_path / "n", {a: {}, b: {}})
    df = compare(base, new)
    assert row(df, a).verdict == "not-timed"
    assert row(df, b).verdict == "inconclusive" and "only in the base run" in row(df, b).note


def test_min_attainable_p_matches_scipy_exact():
    for n in (5, 6, 7, 10):
        exact = mannwhitneyu(np.arange(n) + 100.0, np.arange(n, dtype=float), method="exact").pvalue
        assert min_attainable_p(n, n) == pytest.approx(exact)
    assert min_attainable_p(6, 6) > ALPHA > min_attainable_p(7, 7)


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
    k = key(2)
    df = compare(*pair(tmp_path, new_rows={k: new_extra}, base_rows={k: base_extra}))
    r = row(df, k)
    assert r.correctness == expected and needle in r.note
    assert r.regression == (expected in ("worse", "lost"))
    assert df.rows.regression.sum() == (expected in ("worse", "lost"))


def test_rows_only_in_one_run_are_listed_not_gating(tmp_path):
    a, b, c = key(0), key(1), key(2, phase="bwd")
    base = write_run(tmp_path / "b", {a: {}, b: {}}, {a: lognormal(1), b: lognormal(2)})
    new = write_run(tmp_path / "n", {a: {}, c: {}}, {a: lognormal(3), c: lognormal(4)})
    df = compare(base, new)
    assert row(df, b).verdict == "base-only" and row(df, c).verdict == "new-only"
    assert row(df, a).verdict == "unchanged" and not df.regression


def test_different_testbeds_refused_without_cross_device(tmp_path):
    base, new = pair(tmp_path, {key(0): lognormal(seed=9) * 1.5}, testbed="tb-gpu-h100",
                     device_name="NVIDIA H100 80GB HBM3")
    refused = r"different testbeds.*'tb-cpu-a'.*'tb-gpu-h100'.*device_name.*--cross-device"
    with pytest.raises(MismatchedTestbeds, match=refused):
        compare(base, new)
    df = compare(base, new, cross_device=True)
    assert df.mode == "cross-device"
    assert row(df, key(0)).verdict == "slower" and not df.regression  # a report, not a gate


def test_busy_or_throttled_runs_are_warned_about(tmp_path, capsys):
    base, new = pair(tmp_path)
    env = json.loads((new / "env.json").read_text())
    env.update(cpu_count=2, clocks_start={"loadavg": [5.2, 4.0, 3.0]}, clocks_end={"throttle_reasons": "0x4"})
    (new / "env.json").write_text(json.dumps(env))
    quiet = {"cpu_count": 2, "clocks_start": {"loadavg": [1.5]}, "clocks_end": {"throttle_reasons": "0x1"}}
    assert run_warnings(quiet) == []
    df = compare(base, new)
    assert df.warnings == ["new run: start: load average 5.2 on 2 CPUs (other processes competed for them)",
                                    "new run: end: GPU clock throttle reasons 0x4"]
    res = harness(capsys, "compare", str(base), str(new))
    assert res.returncode == 0 and "WARNING new run: start: load average 5.2" in res.stdout
    assert "|ratio-1| of timed rows: median" in res.stdout  # the run-to-run noise, to choose --min-effect


def test_bad_thresholds_are_errors():
    with pytest.raises(ValueError, match="alpha=1.5"):
        CompareConfig(alpha=1.5)
    with pytest.raises(ValueError, match="min_effect=-0.1"):
        CompareConfig(min_effect=-0.1)


def test_cli_gate_exit_codes_and_outputs(tmp_path, capsys):
    slow = key(4)
    base, new = pair(tmp_path, {slow: lognormal(seed=4004) * 1.25})
    out = tmp_path / "report"
    res = harness(capsys, "compare", str(base), str(new), "--out", str(out))
    assert res.returncode == 1, res.stdout + res.stderr
    line = next(ln for ln in res.stdout.splitlines() if slow[0] in ln)
    assert "slower" in line and "1.2" in line and "e-" in line  # verdict, ratio and a p-value on the row
    assert "REGRESSION: 1 row(s)" in res.stdout
    csv = pd.read_csv(out / "compare.csv")
    assert len(csv) == N_KEYS and csv.regression.sum() == 1
    assert "| slower |" in (out / "compare.md").read_text()
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    same_base, same_new = pair(tmp_path / "same")
    res = harness(capsys, "compare", str(same_base), str(same_new))
    assert res.returncode == 0 and "no regression" in res.stdout, res.stdout
    assert (same_new / "compare-vs-base" / "compare.csv").exists()


def test_cli_testbed_mismatch_is_an_error_unless_cross_device(tmp_path, capsys):
    base, new = pair(tmp_path, {key(0): lognormal(seed=9) * 1.5}, testbed="tb-other")
    res = harness(capsys, "compare", str(base), str(new))
    assert res.returncode == 2 and "different testbeds" in res.stderr and "--cross-device" in res.stderr
    res = harness(capsys, "compare", str(base), str(new), "--cross-device", "--out", str(tmp_path / "x"))
    assert res.returncode == 0 and "not a regression gate" in res.stdout, res.stdout + res.stderr


def rounds(seed: int, scales=(1.0, 1.0, 1.0), n: int = 20, sigma: float = 0.02) -> list[np.ndarray]:
    """Samples of one key in len(scales) rounds; round i runs at scales[i] x the median."""
    return [lognormal(seed=seed * 10 + i, n=n, sigma=sigma) * s for i, s in enumerate(scales)]


def test_a_transient_in_one_round_is_not_a_regression(tmp_path):
    """Real case (2-core VM): one run's keys of one case all ran ~35% slower for a few seconds. Spread over
    rounds, that hits one round of three; pooled into one round, the rank test calls it a regression."""
    k = key(0)
    base = write_run(tmp_path / "b", {k: {}}, {k: rounds(1)})
    new = write_run(tmp_path / "n", {k: {}}, {k: rounds(2, (1.0, 1.35, 1.35))})
    r = row(compare(base, new), k)
    assert r.p_value < ALPHA and r.ratio > 1.05  # what samples alone say
    assert r.verdict == "inconclusive" and not r.regression and r.round_p >= ALPHA, r
    assert "not across rounds" in r.note and (r.rounds_base, r.rounds_new) == (3, 3)
    pooled = write_run(tmp_path / "n1", {k: {}}, {k: np.concatenate(rounds(2, (1.0, 1.35, 1.35)))})
    base1 = write_run(tmp_path / "b1", {k: {}}, {k: np.concatenate(rounds(1))})
    r1 = row(compare(base1, pooled), k)
    assert r1.verdict == "slower" and "one round" in r1.note  # without rounds, the transient passes for a regression


def test_a_slowdown_in_every_round_is_a_regression(tmp_path):
    k, f = key(0), key(1)
    base = write_run(tmp_path / "b", {k: {}, f: {}}, {k: rounds(1), f: rounds(3)})
    # round medians scattered by a few % on both sides, as between rounds of a real run
    new = write_run(tmp_path / "n", {k: {}, f: {}}, {k: rounds(2, (1.17, 1.2, 1.24)), f: rounds(4, (0.7, 0.75, 0.72))})
    df = compare(base, new)
    r = row(df, k)
    assert r.verdict == "slower" and r.regression and r.round_p < ALPHA and r.ratio == pytest.approx(1.2, rel=0.03)
    assert row(df, f).verdict == "faster"


def test_round_alpha_is_configurable_and_validated(tmp_path):
    k = key(0)
    base = write_run(tmp_path / "b", {k: {}}, {k: rounds(1)})
    new = write_run(tmp_path / "n", {k: {}}, {k: rounds(2, (1.1, 1.3, 1.2))})
    r = row(compare(base, new), k)
    assert r.verdict == "inconclusive" and 0.002 <= r.round_p < 0.05
    assert row(compare(base, new, round_alpha=0.05), k).verdict == "slower"
    with pytest.raises(ValueError, match="round_alpha=1.5"):
        CompareConfig(round_alpha=1.5)


def test_cli_passes_round_alpha(tmp_path, capsys):
    k = key(0)
    base = write_run(tmp_path / "b", {k: {}}, {k: rounds(1)})
    new = write_run(tmp_path / "n", {k: {}}, {k: rounds(2, (1.1, 1.3, 1.2))})
    out = str(tmp_path / "out")
    assert harness(capsys, "compare", str(base), str(new), "--out", out).returncode == 0  # inconclusive
    res = harness(capsys, "compare", str(base), str(new), "--out", out, "--round-alpha", "0.05")
    assert res.returncode == 1 and "round medians p < 0.05" in res.stdout, res.stdout
