"""Issue 35: the gate on a loaded machine (synthetic runs whose env.json records the load, re-measurement on the
seeded LoadedMachine of tests/fixtures/noise_models.py), what it tells a user to do, and compare.png's tick
labels. compare's answer to any stored samples: test_gate_properties.py."""

import json
import math
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.cli.compare import undecided_advice
from harness.cli.main import main
from harness.compare.remeasure import RemeasureConfig, remeasure
from harness.compare.report import ratio_figure, ratio_ticks, summary
from harness.compare.runs import EXIT_OK, EXIT_UNDECIDED, compare_runs
from harness.measure.stats import SLOWER, UNCHANGED, UNDECIDED
from tests.fixtures.noise_models import FakeTimer, LoadedMachine, Noise, synthetic_cases, synthetic_run
from tests.fixtures.regress_fixtures import key

QUIET = Noise(sigma=0.03, tail_df=2.5)


def harness(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


def loaded(run: Path, load: float = 4.7, cpus: int = 2) -> Path:
    """Record in a run's env.json that it started on a loaded machine (what store/environment.py writes)."""
    env = json.loads((run / "env.json").read_text())
    env.update(cpu_count=cpus, clocks_start={"loadavg": [load, load, load]})
    (run / "env.json").write_text(json.dumps(env))
    return run


def test_a_slower_key_of_the_runs_says_that_remeasure_decides_it(tmp_path, capsys):
    base = synthetic_run(tmp_path / "base", 1, QUIET, rounds=8)  # enough rounds for the family-wise level
    new = synthetic_run(tmp_path / "new", 2, QUIET, change={4: 1.5}, rounds=8)
    cmp = compare_runs(base, new)
    row = cmp.rows[cmp.rows.case_id == key(4)[0]].iloc[0]
    assert row.verdict == SLOWER and "compare --remeasure confirms or refutes it" in row.note
    assert "REGRESSION: 1 row(s) (1 slower from the runs' own rounds only: compare --remeasure" in summary(cmp)


def test_a_run_made_under_load_cannot_fail_the_gate_on_its_own_rounds(tmp_path, capsys):
    """The issue's new user: plain `compare A B` of one commit's two runs under load exited 1. A run whose
    env.json records a load average above the CPU count leaves its slower keys undecided, for the pairs."""
    base = synthetic_run(tmp_path / "base", 1, QUIET)
    new = loaded(synthetic_run(tmp_path / "new", 2, QUIET, change={4: 1.5, 7: 2.0}))
    cmp = compare_runs(base, new)
    flagged = cmp.rows[cmp.rows.verdict != UNCHANGED]
    assert set(flagged.verdict) == {UNDECIDED} and set(flagged.case_id) == {key(4)[0], key(7)[0]}
    assert flagged.note.str.contains("new run start: load average 4.7 on 2 CPUs").all()
    assert cmp.exit_code() == EXIT_UNDECIDED
    res = harness(capsys, "compare", str(base), str(new), "--out", str(tmp_path / "out"))
    assert res.returncode == EXIT_UNDECIDED and "REGRESSION" not in res.stdout
    assert f"compare {base} {new} --remeasure" in res.stdout and "times base and new code in pairs" in res.stdout


def _suspects(tmp_path: Path):
    base = synthetic_run(tmp_path / "base", 0, QUIET)
    return compare_runs(base, synthetic_run(tmp_path / "new", 100, QUIET, change={k: 1.3 for k in range(8)}))


@pytest.mark.parametrize("seed", range(4))
def test_remeasure_on_a_loaded_machine_never_calls_unchanged_code_slower(tmp_path, seed):
    cmp = _suspects(tmp_path)
    machine = LoadedMachine(seed, burst_p=0.3)
    remeasure(cmp, RemeasureConfig(budget_s=600), timer=FakeTimer({}, QUIET, 1, machine),
              base_timer=FakeTimer({}, QUIET, 2, machine), cases=synthetic_cases(), log=lambda *_: None,
              load=lambda: (4.7, 2))
    rows = cmp.rows[cmp.rows.remeasured.astype(bool)]
    assert SLOWER not in set(rows.verdict) and cmp.exit_code() in (EXIT_OK, EXIT_UNDECIDED)
    stuck = rows[rows.verdict == UNDECIDED]
    assert stuck.note.str.contains("load average 4.7 on 2 CPUs during re-measurement").all()
    assert stuck.note.str.contains("quieter machine").all()


def test_what_the_advice_says_after_remeasure(tmp_path):
    """The issue's new user got the same command again: the advice is each key's own reason."""
    cmp = _suspects(tmp_path)
    machine = LoadedMachine(3, burst_p=0.5)
    remeasure(cmp, RemeasureConfig(budget_s=600), timer=FakeTimer({}, QUIET, 1, machine),
              base_timer=FakeTimer({}, QUIET, 2, machine), cases=synthetic_cases(), log=lambda *_: None,
              load=lambda: (4.7, 2))
    assert len(cmp.undecided), "the loaded machine left no key undecided: pick a burstier seed"
    args = Namespace(base="A", new="B", fail_on_undecided=True, remeasure=True)
    advice = undecided_advice(cmp.undecided, args, cmp.remeasure_next)
    assert "undecided after re-measurement" in advice and "quieter machine" in advice
    assert "--remeasure-max-pairs" in advice and "Re-measure them here" not in advice
    # issue 67 item 4: the summary names the next step not taken (here the pair limit, the load), not --remeasure
    assert cmp.remeasure_next in summary(cmp) and "--remeasure)" not in summary(cmp)
    assert "--remeasure-max-pairs" in cmp.remeasure_next and "quieter machine" in cmp.remeasure_next


def test_compare_png_tick_labels_do_not_collide(tmp_path):
    """Issue 35: 0.9x 0.95x 1x 1.05x 1.1x overlapped on a 0.25x-4x axis."""
    base = synthetic_run(tmp_path / "base", 1, QUIET)
    new = synthetic_run(tmp_path / "new", 2, QUIET, change={0: 0.25, 1: 4.0, 2: 1.05, 3: 0.95, 4: 1.1})
    fig = ratio_figure(compare_runs(base, new))
    fig.canvas.draw()
    ax = fig.axes[0]
    boxes = [t.get_window_extent() for t in ax.get_xticklabels() if t.get_text()]
    assert len(boxes) >= 4 and "1x" in [t.get_text() for t in ax.get_xticklabels()]
    boxes.sort(key=lambda b: b.x0)
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:])), [(b.x0, b.x1) for b in boxes]
    assert ratio_ticks(0.95, 1.06) == [0.95, 1, 1.05] and ratio_ticks(math.nan, 2) == [1.0]


def test_too_few_pairs_is_a_one_line_error(capsys):
    res = harness(capsys, "compare", "a", "b", "--remeasure-max-pairs", "2")
    assert res.returncode == 2 and res.stderr.strip() == \
        "error: --remeasure-max-pairs=2: must be >= 4 (a key is never passed on fewer pairs)"
