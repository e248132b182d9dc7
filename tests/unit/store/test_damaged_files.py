"""Damaged or foreign files give one-line errors that name the file (and the line); a line cut short by a killed
writer is dropped with a warning; a newer schema is refused, an older one read with the columns it lacks."""

import json

import pandas as pd
import pytest

from harness.launch.merge import merge_runs
from harness.store.load import load_results, load_samples, refused_rows
from harness.store.run_dir import read_env, results_root
from harness.store.schema import COLUMNS, SCHEMA_VERSION, Row
from harness.store.writer import ResultsWriter


def _run(path, rows=2):
    path.mkdir(parents=True)
    ResultsWriter(path / "results.csv").write([Row(run_id="r", case_id=f"c{i}", backend="naive", phase="fwd",
                                                   status="pass") for i in range(rows)])
    return path


def test_csv_without_status_is_not_a_results_file(tmp_path):
    (tmp_path / "results.csv").write_text("run_id,case_id,backend,phase\nr,c,naive,fwd\n")
    with pytest.raises(ValueError, match=r"results.csv: not a harness results file \(missing columns \['status'\]\)"):
        load_results(tmp_path)


def test_a_line_cut_short_is_dropped_with_a_warning(tmp_path):
    run = _run(tmp_path / "run")
    with (run / "results.csv").open("a") as f:
        f.write("20261130-1200")  # a writer killed mid-line: the run id fragment alone
    with pytest.warns(UserWarning, match=r"results.csv: refused 1 line\(s\) that do not parse \(line 4: 1 fields"):
        df = load_results(run)
    assert list(df.case_id) == ["c0", "c1"] and refused_rows(df) == 1


def test_unreadable_csv_names_the_file(tmp_path):
    (tmp_path / "results.csv").write_bytes(b"run_id,case_id,backend,phase,status\n\xff\xfe\x00bad\n")
    with pytest.raises(ValueError, match="results.csv: not a readable CSV"):
        load_results(tmp_path)


def test_a_newer_schema_is_refused_an_older_one_read(tmp_path):
    run = _run(tmp_path / "new")
    df = pd.read_csv(run / "results.csv")
    df.assign(schema_version=SCHEMA_VERSION + 1).to_csv(run / "results.csv", index=False)
    with pytest.raises(ValueError, match=f"written with results schema {SCHEMA_VERSION + 1}; this harness reads up"):
        load_results(run)
    old = tmp_path / "old"
    old.mkdir()
    df.drop(columns=["timing_status", "timing_reason", "baseline"]).assign(schema_version=1).to_csv(
        old / "results.csv", index=False)
    assert len(load_results(old)) == 2


def test_a_schema_2_file_loads_without_the_modifier_columns(tmp_path):
    run = _run(tmp_path / "v3")
    v3_only = ["head_dim_v", "modifiers", "modifier_path", "dsinks_err", "dsinks_tol", "dbias_err", "dbias_tol",
               "naive_dsinks_err", "naive_dbias_err"]
    old = tmp_path / "v2"
    old.mkdir()
    pd.read_csv(run / "results.csv").drop(columns=v3_only).assign(schema_version=2).to_csv(old / "results.csv",
                                                                                            index=False)
    assert len(load_results(old)) == 2
    from harness.report.data import load_run
    report = load_run(old).df  # the report reads them as cases without modifiers, v with q/k's head dim
    assert set(report.modifier_kind) == {"none"} and report.head_dim_v.equals(report.head_dim)  # NaN here: no sizes


def test_a_schema_4_file_loads_without_fp8_q(tmp_path):
    """Schema 5 added fp8_q (FP8 Q/K/V cases): a file written before it loads without it (as the older columns do:
    no FP8 queries), its other columns as they were."""
    run = tmp_path / "v5"
    run.mkdir()
    ResultsWriter(run / "results.csv").write([Row(run_id="r", case_id="c-fp8qkv-head", backend="naive", phase="fwd",
                                                  status="pass", fp8_kv="head", fp8_q=True),
                                              Row(run_id="r", case_id="c", backend="naive", phase="fwd",
                                                  status="pass")])
    assert SCHEMA_VERSION >= 5 and list(load_results(run).fp8_q.isna()) == [False, True]
    old = tmp_path / "v4"
    old.mkdir()
    pd.read_csv(run / "results.csv").drop(columns=["fp8_q"]).assign(schema_version=4).to_csv(old / "results.csv",
                                                                                          index=False)
    df = load_results(old)
    assert len(df) == 2 and "fp8_q" not in df and list(df.fp8_kv.fillna("")) == ["head", ""]


def test_merge_writes_one_schema_version(tmp_path):
    new = _run(tmp_path / "a")
    old = tmp_path / "b"
    old.mkdir()
    pd.read_csv(_run(tmp_path / "b0", rows=1) / "results.csv").drop(columns=["timing_status", "baseline"]).assign(
        case_id="other", schema_version=1).to_csv(old / "results.csv", index=False)
    merged = merge_runs([new, old], tmp_path / "merged")
    assert len(merged) == 3 and set(merged.schema_version) == {SCHEMA_VERSION}
    assert list(pd.read_csv(tmp_path / "merged" / "results.csv").columns) == list(COLUMNS)


def test_bad_env_json_names_the_file_and_line(tmp_path):
    (tmp_path / "env.json").write_text('{"testbed_id": "x",\n  "threads": }\n')
    with pytest.raises(ValueError, match=r"env.json: not valid JSON \(line 2"):
        read_env(tmp_path)
    (tmp_path / "env.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="env.json: expected a JSON object, found list"):
        read_env(tmp_path)


def test_samples_without_their_columns_name_the_file(tmp_path):
    (tmp_path / "samples.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="samples.csv: not a harness samples file"):
        load_samples(tmp_path)


def test_results_dir_that_is_a_file_or_unwritable(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="--results-dir .*/f' is a file"):
        results_root(tmp_path / "f")
    with pytest.raises(ValueError, match="cannot be created"):
        results_root(tmp_path / "f" / "sub")
