"""The history index gives the CSV path's answers (tables, change points, noise models, warnings and refusals),
reads a run again only when its files changed, rebuilds to the same answers, and takes concurrent ingests."""

import json
import multiprocessing
import shutil
import warnings

import numpy as np
import pandas as pd
import pytest

from harness.history.changes import detect_changes
from harness.history.stored import history_text, load_history, summarize, summary_text
from harness.history.index import CHANGE_COLUMNS, CODE_COLUMNS, INDEX_DIR, open_index
from harness.history.noise import build_noise_model
from harness.store.schema import KEY
from tests.fixtures.regress_fixtures import key, lognormal, write_run

KEYS = [key(0), key(1, backend="sdpa-math"), key(2, phase="fwd+bwd")]


def write_history(root, runs=14, step_at=6, seed=0):
    """Two testbeds' runs: a 1.3x step at `step_at`, repeated shas (noise from runs) on tb-a, every run's own on tb-b;
    one run killed mid-way, one with a damaged line, one that is no results file."""
    rng = np.random.default_rng(seed)
    for i in range(runs):
        level = 1.3 if i >= step_at else 1.0
        samples = {k: [level * (j + 1) * rng.lognormal(0, 0.02, 10) for _ in range(3)] for j, k in enumerate(KEYS)}
        testbed = "tb-a" if i % 2 else "tb-b"
        write_run(root / f"run{i:02d}", {k: {} for k in KEYS}, samples, testbed=testbed,
                  started=f"2026-03-{i + 1:02d}T00:00:00", git_sha=f"{i % 3}" * 7 if testbed == "tb-a" else f"{i:07d}")
    env = json.loads((root / "run05" / "env.json").read_text())
    (root / "run05" / "env.json").write_text(json.dumps({**env, "status": "running", "stage": "benchmark"}))
    with open(root / "run07" / "results.csv", "a") as f:
        f.write("run07,fp32-cut,naive,fwd,pa")  # a writer killed mid-line
    (root / "broken").mkdir()
    (root / "broken" / "results.csv").write_text("not,a,harness,file\n1,2,3,4\n")
    return root


def csv_answers(root):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        h = load_history(root)
    out = {"text": history_text(h), "warnings": sorted({str(w.message) for w in said})}
    timed = h[pd.to_numeric(h.latency_ms, errors="coerce") > 0]
    out["changes"] = detect_changes(timed)
    for tb in ("tb-a", "tb-b"):
        path = build_noise_model(h, tb, root / "csv-noise")
        out[tb] = {k: v for k, v in json.loads(path.read_text()).items() if k != "built"}
    return out


def index_answers(root, store=None):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ix = open_index(root, store)
        out = {"text": summary_text(ix.summary(), ix.notes())}
        out["changes"] = detect_changes(ix.rows(CHANGE_COLUMNS, timed=True))
        for tb in ("tb-a", "tb-b"):
            runs = ix.rows(("run_id", "testbed_id", *KEY, *CODE_COLUMNS), testbed=tb)
            path = build_noise_model(runs, tb, root / "ix-noise", ix.rounds(tb))
            out[tb] = {k: v for k, v in json.loads(path.read_text()).items() if k != "built"}
    out["warnings"] = sorted({str(w.message) for w in said})
    return out, ix


def assert_same(a, b):
    assert a["text"] == b["text"]
    assert a["warnings"] == b["warnings"]
    pd.testing.assert_frame_equal(a["changes"].astype(str), b["changes"].astype(str))
    for tb in ("tb-a", "tb-b"):
        assert a[tb] == b[tb]


@pytest.fixture(scope="module")
def history_dir(tmp_path_factory):
    return write_history(tmp_path_factory.mktemp("history"))


def test_the_index_answers_as_the_csvs_do(history_dir):
    csv = csv_answers(history_dir)
    assert len(csv["changes"]) == 2 * len(KEYS) and set(csv["changes"].at_run) == {3}  # the step, on each testbed
    assert {m["source"] for m in csv["tb-a"]["keys"].values()} == {"runs"}
    assert {m["source"] for m in csv["tb-b"]["keys"].values()} == {"rounds"}
    assert "incomplete run run05: stopped during the benchmark stage" in csv["text"]
    assert any("run07" in w and "refused 1 line(s)" in w for w in csv["warnings"])
    assert any(w.startswith("skipping run ") and "broken" in w and "not a harness results file" in w
               for w in csv["warnings"])
    index, ix = index_answers(history_dir)
    assert_same(csv, index)
    assert ix.manifests["broken"]["status"] == "refused"  # recorded, with the loader's one-line reason
    assert ix.summary().equals(summarize(load_history(history_dir)))


def test_deleting_the_index_and_rebuilding_it_gives_the_same_answers(history_dir):
    first, _ = index_answers(history_dir)
    shutil.rmtree(history_dir / INDEX_DIR)
    again, ix = index_answers(history_dir)
    assert len(ix.ingested) == len(ix.manifests) == 15
    assert_same(first, again)


def test_a_noise_model_read_a_few_runs_at_a_time_is_the_one_read_at_once(history_dir, tmp_path):
    columns = ("testbed_id", *KEY, *CODE_COLUMNS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ix = open_index(history_dir)
        for tb in ("tb-a", "tb-b"):
            assert len(list(ix.noise_parts(columns, tb, runs_at_once=2))) == 4  # 7 runs: 2, 2, 2 and 1
            paths = [build_noise_model(ix.rows(columns, testbed=tb), tb, tmp_path / "whole", ix.rounds(tb)),
                     build_noise_model(ix.noise_parts(columns, tb, runs_at_once=2), tb, tmp_path / "parts")]
            whole, parts = ({k: v for k, v in json.loads(p.read_text()).items() if k != "built"} for p in paths)
            assert whole == parts and whole["runs"] == 7 and whole["keys"]


def test_a_run_is_read_again_only_when_its_files_change(tmp_path):
    root = write_history(tmp_path, runs=8)
    assert len(open_index(root).ingested) == 9
    assert open_index(root).ingested == []
    shutil.rmtree(root / "run03")
    write_run(root / "run03", {k: {} for k in KEYS}, {KEYS[0]: lognormal(1, median_ms=9.0)}, testbed="tb-a",
              started="2026-03-04T00:00:00")  # rewritten: its latency is now 9 ms
    shutil.rmtree(root / "run04")  # removed: forgotten by the index
    ix = open_index(root)
    assert ix.ingested == ["run03"] and "run04" not in ix.manifests
    rows = ix.rows(("run_id", *KEY, "latency_ms"), timed=True)
    assert rows[rows.run_id == "run03"].latency_ms.round(1).tolist() == [9.0]
    assert summarize(load_history(root)).equals(ix.summary())


def _ingest(root, store, names, seed):
    """One machine of a fleet: writes its own runs into the shared results folder, ingesting after each."""
    rng = np.random.default_rng(seed)
    for name in names:
        write_run(root / name, {k: {} for k in KEYS}, {k: [rng.lognormal(0, 0.02, 5)] for k in KEYS},
                  started=f"2026-05-01T00:00:{int(name[-2:]):02d}")
        open_index(root, store)


def run_machines(root, store, machines: int, runs: int) -> list:
    """`machines` processes at once, each writing `runs` runs and ingesting after each; their exit codes."""
    root.mkdir()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_ingest, args=(root, store, [f"m{p}-run{i:02d}" for i in range(runs)], p))
             for p in range(machines)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    return [p.exitcode for p in procs]


def test_concurrent_ingests_from_several_processes_lose_no_run_and_tear_no_file(tmp_path):
    root, store = tmp_path / "results", tmp_path / "shared-index"
    assert run_machines(root, store, 4, 4) == [0] * 4
    ix = open_index(root, store)
    assert len(ix.manifests) == 16 and all(m["status"] == "ok" for m in ix.manifests.values())
    assert not list(store.rglob("*.tmp"))
    assert ix.summary().equals(summarize(load_history(root)))
    assert len(ix.rows(KEY)) == 16 * len(KEYS) and len(ix.rounds()) == 16 * len(KEYS)


def test_a_run_folder_still_being_written_is_listed_by_its_notes_not_a_crash(tmp_path):
    """A run another machine is writing (its results.csv's header there, no row yet) was read as a frame of notes alone,
    which summarize could not group (no status column): one ingest of the fleet test died on it under load."""
    from harness.history.index import read_run

    run = write_run(tmp_path / "results" / "run01", {k: {} for k in KEYS}, testbed="tb-a")
    header = (run / "results.csv").read_text().splitlines()[0]
    (run / "results.csv").write_text(header + "\n")  # its header written, no row yet
    env = json.loads((run / "env.json").read_text())
    (run / "env.json").write_text(json.dumps({**env, "state": "running"}))
    entry = read_run(run)
    assert entry.manifest["status"] == "ok" and entry.manifest["summary"]["rows"] == 0
    assert summarize(load_history(tmp_path / "results")).rows.tolist() == [0]
