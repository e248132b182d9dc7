"""The loader is strict and says what it dropped (issue 35): a line that does not parse - cut short, a non-number
in a numeric column, an unknown status or phase, a damaged sample - is refused with a warning naming the file and
the line, never read as a guess; the count rides on the frame, and the report, history and compare say it."""

import subprocess
import sys
import warnings

import pytest

from harness.history.stored import history_text, load_history
from harness.compare.report import header
from harness.compare.runs import compare_runs
from harness.report.data import load_run
from harness.report.document import report_blocks
from harness.store.load import compact, load_results, load_samples, refused_rows
from harness.store.schema import COLUMNS, Row
from harness.store.writer import ResultsWriter, SamplesWriter

LATENCY = 0.089363


def _run(path, n=3, samples=True):
    """A run of `n` naive keys, each timed at LATENCY ms, with its samples."""
    path.mkdir(parents=True)
    ResultsWriter(path / "results.csv").write(
        [Row(run_id="r", case_id=f"c{i}", backend="naive", phase="fwd", status="pass", out_err=0.001,
             latency_ms=LATENCY, timing_status="timed", testbed_id="tb") for i in range(n)])
    if samples:
        writer = SamplesWriter(path / "samples.csv")
        for i in range(n):
            writer.write("r", f"c{i}", "naive", "fwd", [LATENCY] * 5)
    return path


def _lines(path):
    return (path / "results.csv").read_text().splitlines(keepends=True)


def _replace_cell(run, line_no, column, value):
    lines = _lines(run)
    cells = lines[line_no - 1].rstrip("\r\n").split(",")
    cells[COLUMNS.index(column)] = value
    lines[line_no - 1] = ",".join(cells) + "\r\n"
    (run / "results.csv").write_text("".join(lines))


def test_a_line_cut_after_the_key_columns_is_refused_not_read_as_status_pa(tmp_path):
    """The issue's case: a line cut inside its latency loaded with status 'pa' and latency 0.08."""
    run = _run(tmp_path / "run")
    lines = _lines(run)
    last = lines[-1]
    cut = last[:last.index(str(LATENCY)) + 4]  # '...,pass,...,0.08'
    (run / "results.csv").write_text("".join(lines[:-1]) + cut)
    with pytest.warns(UserWarning, match=r"results.csv: refused 1 line\(s\) that do not parse \(line 4: "):
        df = load_results(run)
    assert list(df.case_id) == ["c0", "c1"] and set(df.latency_ms) == {LATENCY} and refused_rows(df) == 1
    # cut in the middle of the status: the same
    (run / "results.csv").write_text("".join(lines[:-1]) + last[:last.index("pass") + 2] + "\r\n")
    with pytest.warns(UserWarning, match=r"line 4: \d+ fields where the header has \d+"):
        assert refused_rows(load_results(run)) == 1


def test_a_whole_last_line_without_its_end_is_refused(tmp_path):
    """A writer ends every line it finished; a cut inside the last cell leaves the field count whole."""
    run = _run(tmp_path / "run")
    text = (run / "results.csv").read_text()
    (run / "results.csv").write_text(text.rstrip("\r\n"))
    with pytest.warns(UserWarning, match=r"line 4: the file ends inside it"):
        df = load_results(run)
    assert refused_rows(df) == 1 and len(df) == 2


@pytest.mark.parametrize("column, value, why", [
    ("latency_ms", "fast", r"latency_ms 'fast' is not a number"),
    ("out_err", "0.0x1", r"out_err '0.0x1' is not a number"),
    ("status", "passed", r"status 'passed' is not one of pass, fail"),
    ("phase", "forward", r"phase 'forward' is not one of fwd, bwd"),
    ("timing_status", "ok", r"timing_status 'ok' is not one of timed"),
    ("n_samples", "7.5", r"n_samples '7.5' is not an integer"),
    ("noisy", "maybe", r"noisy 'maybe' is not true or false"),
    ("backend", "", r"backend is empty"),
])
def test_a_cell_that_is_not_its_columns_kind_refuses_its_line(tmp_path, column, value, why):
    run = _run(tmp_path / "run")
    _replace_cell(run, 3, column, value)
    with pytest.warns(UserWarning, match=rf"results.csv: refused 1 line\(s\) that do not parse \(line 3: {why}"):
        df = load_results(run)
    assert refused_rows(df) == 1 and list(df.case_id) == ["c0", "c2"]


def test_a_clean_file_warns_nothing_and_refuses_nothing(tmp_path):
    run = _run(tmp_path / "run")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        df, samples = load_results(run), load_samples(run)
    assert refused_rows(df) == 0 and refused_rows(samples) == 0 and len(samples) == 15


@pytest.mark.parametrize("value", ["x", "-1.0", "inf", ""])
def test_a_damaged_sample_is_refused_with_its_line(tmp_path, value):
    run = _run(tmp_path / "run")
    lines = (run / "samples.csv").read_text().splitlines(keepends=True)
    lines[4] = lines[4].rsplit(",", 1)[0] + f",{value}\r\n"
    (run / "samples.csv").write_text("".join(lines))
    with pytest.warns(UserWarning, match=r"samples.csv: refused 1 line\(s\) that do not parse \(line 5: latency_ms"):
        samples = load_samples(run)
    assert refused_rows(samples) == 1 and len(samples) == 14 and set(samples.latency_ms) == {LATENCY}


def test_compact_keeps_a_file_with_refused_lines_as_it_is(tmp_path):
    run = _run(tmp_path / "run")
    _replace_cell(run, 2, "latency_ms", "fast")
    before = (run / "results.csv").read_text()
    with pytest.warns(UserWarning, match="refused 1 line"):
        compact(run / "results.csv")
    assert (run / "results.csv").read_text() == before


def _damaged(tmp_path):
    run = _run(tmp_path / "runs" / "b")
    _replace_cell(run, 2, "latency_ms", "fast")
    _replace_cell(run, 3, "status", "passed")
    return run


def test_the_report_says_how_many_lines_were_refused(tmp_path):
    run_dir = _damaged(tmp_path)
    with pytest.warns(UserWarning, match="refused 2 line"):
        run = load_run(run_dir)
    assert run.refused == {"results.csv": 2}
    text = " ".join(getattr(b, "text", "") for b in report_blocks(run, {}))
    assert "2 line(s) of results.csv refused as unreadable" in text


def test_history_says_how_many_lines_were_refused(tmp_path):
    _damaged(tmp_path)
    _run(tmp_path / "runs" / "a")
    with pytest.warns(UserWarning, match="refused 2 line"):
        history = load_history(tmp_path / "runs")
    text = history_text(history)
    assert "run r: 2 line(s) of results.csv refused as unreadable" in text
    assert "4 rows" in text  # 3 of the clean run, 1 of the damaged one


def test_compare_says_how_many_lines_were_refused(tmp_path):
    base = _run(tmp_path / "runs" / "a")
    new = _damaged(tmp_path)
    with pytest.warns(UserWarning, match="refused 2 line"):
        cmp = compare_runs(base, new, use_noise_model=False)
    assert cmp.notes == ["new run: 2 line(s) of results.csv refused as unreadable (damaged or cut short; the "
                         "warning lists them)"]
    assert "NOTE new run: 2 line(s) of results.csv refused" in header(cmp)
    assert set(cmp.rows.verdict) >= {"missing"}  # the refused keys are missing from the new run, not guessed


def test_the_cli_warning_is_one_line_naming_the_file_and_line(tmp_path):
    run_dir = _damaged(tmp_path)
    res = subprocess.run([sys.executable, "-m", "harness", "history", str(run_dir.parent)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    warning = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(warning) == 1 and warning[0].startswith("warning: ") and "results.csv: refused 2 line(s)" in warning[0]
    assert "line 2: latency_ms 'fast' is not a number; line 3: status 'passed'" in warning[0]
