"""Results storage: schema validation, rows survive interruption, stages fold into one row per key."""

import pandas as pd
import pytest

from harness.store.load import compact, load_results
from harness.store.schema import COLUMNS, Row
from harness.store.writer import ResultsWriter


def row(**kw) -> Row:
    base = {"run_id": "r", "case_id": "c1", "backend": "naive", "phase": "fwd", "status": "pass"}
    return Row(**(base | kw))


def test_rows_are_on_disk_after_each_write(tmp_path):
    path = tmp_path / "run" / "results.csv"
    writer = ResultsWriter(path)
    writer.write([row(out_err=0.1)])
    # a reader that starts now (e.g. after the writer process was killed) sees the row
    df = pd.read_csv(path)
    assert list(df.columns) == list(COLUMNS) and len(df) == 1 and df.out_err[0] == 0.1


def test_later_stage_fills_columns_of_the_same_key(tmp_path):
    path = tmp_path / "results.csv"
    writer = ResultsWriter(path)
    writer.write([row(out_err=0.1), row(phase="bwd", dq_err=0.2)])
    writer.write([row(latency_ms=1.5)])
    df = load_results(tmp_path)
    assert len(df) == 2
    fwd = df[df.phase == "fwd"].iloc[0]
    assert fwd.out_err == 0.1 and fwd.latency_ms == 1.5
    compact(path)
    assert len(pd.read_csv(path)) == 2


@pytest.mark.parametrize("bad, error, match", [
    ({"status": "ok"}, ValueError, "status='ok'; allowed: pass"),
    ({"phase": "forward"}, ValueError, "phase='forward'; allowed: fwd"),
    ({"speed": 3}, TypeError, "unexpected keyword argument 'speed'"),
])
def test_bad_rows_are_refused(tmp_path, bad, error, match):
    with pytest.raises(error, match=match):
        row(**bad)


def test_the_writer_takes_rows_only(tmp_path):
    with pytest.raises(TypeError, match="takes harness.store.schema.Row objects; got dict"):
        ResultsWriter(tmp_path / "r.csv").write([{"run_id": "r"}])


def test_observed_is_read_verbatim(tmp_path):
    """An observed 'nan' or 'None' is an answer (a backend's output was NaN), not a missing value."""
    ResultsWriter(tmp_path / "results.csv").write([row(observed="nan"), row(phase="bwd", observed="None"),
                                                   row(backend="x", observed=None)])
    df = load_results(tmp_path).set_index(["backend", "phase"])
    assert df.loc[("naive", "fwd"), "observed"] == "nan" and df.loc[("naive", "bwd"), "observed"] == "None"
    assert pd.isna(df.loc[("x", "fwd"), "observed"])


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results file"):
        load_results(tmp_path)
    (tmp_path / "results.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a harness results file"):
        load_results(tmp_path)


def test_a_path_that_is_not_a_run_is_named_as_given_with_what_it_looks_like(tmp_path, monkeypatch):
    from harness.store.run_dir import resolve_run

    root = tmp_path / "results"
    for run_id in ("20261201-1", "20261201-2"):
        (root / run_id).mkdir(parents=True)
        (root / run_id / "results.csv").write_text("run_id\n")
    assert resolve_run(root / "20261201-2") == root / "20261201-2"
    monkeypatch.chdir(tmp_path)
    assert resolve_run("20261201-1").resolve() == root / "20261201-1"  # a run id under the results root
    with pytest.raises(FileNotFoundError, match=r"^run 'results': this looks like a results root: pass one of its "
                                                r"run folders: results/20261201-1, results/20261201-2$"):
        resolve_run("results")
    with pytest.raises(FileNotFoundError, match=r"^run 'results/20261201-1/results.csv' is a results.csv file: "
                                                r"pass its folder, 'results/20261201-1'$"):
        resolve_run("results/20261201-1/results.csv")
    (tmp_path / "notarun1").mkdir()
    with pytest.raises(FileNotFoundError) as info:
        resolve_run(str(tmp_path / "notarun1"))
    assert str(info.value) == f"run '{tmp_path / 'notarun1'}': a folder without a results.csv"  # the path as given
    with pytest.raises(FileNotFoundError, match=r"^run 'nope': no such folder, nor a run id under 'results'$"):
        resolve_run("nope")
