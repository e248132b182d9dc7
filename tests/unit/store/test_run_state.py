"""A run knows whether it finished (issue 35): env.json says `running` and the stage from the start, `complete` at
the end; a run killed in between keeps `running` and its stage, and the report, history and compare say so. A
benchmark run stopped during correctness is not called a correctness-only run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.history.stored import history_text, load_history
from harness.compare.report import header
from harness.compare.runs import compare_runs
from harness.run.recorder import RunRecorder
from harness.report.data import load_run
from harness.report.document import report_blocks
from harness.store.run_dir import read_env, write_env
from harness.store.run_state import COMPLETE, RUNNING, incomplete
from harness.store.schema import Row
from harness.store.writer import ResultsWriter

ROOT = Path(__file__).resolve().parents[3]


def _text(run) -> str:
    return " ".join(getattr(b, "text", "") for b in report_blocks(run, {}))


def _killed_run(path, stage="correctness", benchmark=True, testbed="tb"):
    """The state `kill -9` leaves: correctness rows of the first cases, env.json as written at the start and at
    the stage boundary, no end."""
    path.mkdir(parents=True)
    ResultsWriter(path / "results.csv").write(
        [Row(run_id=path.name, case_id=f"c{i}", backend="naive", phase=p, status="pass", testbed_id=testbed)
         for i in range(2) for p in ("fwd", "bwd")])
    write_env(path, {"run_id": path.name, "testbed_id": testbed, "started": "2026-12-01T21:00:00+00:00",
                     "device_name": "cpu", "timing_mode": "cpu-clock", "benchmark": benchmark,
                     "status": RUNNING, "stage": stage})
    return path


def test_the_recorder_writes_running_then_the_stage_then_complete(tmp_path):
    recorder = RunRecorder("r", tmp_path / "r", {"a": 1})
    assert read_env(tmp_path / "r") == {"a": 1, "status": RUNNING, "stage": "start"}
    recorder.enter_stage("correctness")
    assert read_env(tmp_path / "r")["stage"] == "correctness"
    assert incomplete(read_env(tmp_path / "r")) == ("stopped during the correctness stage (killed or crashed: no "
                                                    "end recorded)")
    recorder.finish()
    env = read_env(tmp_path / "r")
    assert env["status"] == COMPLETE and "time_spent" in env and incomplete(env) is None
    stopped = RunRecorder("s", tmp_path / "s")
    stopped.enter_stage("benchmark")
    stopped.finish(complete=False)
    assert incomplete(read_env(tmp_path / "s")) == "interrupted during the benchmark stage"


def test_an_env_json_from_before_the_status_is_incomplete_without_its_time_spent():
    assert incomplete({"started": "x"}) == "stopped before its end (no end recorded)"
    assert incomplete({"started": "x", "time_spent": {}}) is None
    assert incomplete({"started": "x", "shards": []}) is None  # a merged run: its shards finished
    assert incomplete({}) is None  # no env.json: nothing to say


def test_a_benchmark_run_killed_during_correctness_is_reported_incomplete_not_correctness_only(tmp_path):
    run = load_run(_killed_run(tmp_path / "k"))
    text = _text(run)
    assert "Correctness-only" not in text and "Benchmark run without timings" in text
    assert "Incomplete run: stopped during the correctness stage (killed or crashed" in text
    assert _text(load_run(_killed_run(tmp_path / "c", benchmark=False))).count("Correctness-only run") == 1


def test_history_and_compare_say_a_run_is_incomplete(tmp_path):
    base = _killed_run(tmp_path / "runs" / "a")
    (base / "env.json").write_text(json.dumps({**read_env(base), "status": COMPLETE}))
    new = _killed_run(tmp_path / "runs" / "b", stage="benchmark")
    text = history_text(load_history(tmp_path / "runs"))
    assert "incomplete run b: stopped during the benchmark stage" in text
    assert "incomplete run a" not in text
    summary = text.splitlines()
    assert summary[1].split()[-1] == "yes" and summary[2].split()[-1] == "no"  # the 'complete' column
    cmp = compare_runs(base, new, use_noise_model=False)
    assert "NOTE new run: incomplete run: stopped during the benchmark stage" in header(cmp)
    assert not any(n.startswith("base run") for n in cmp.notes)


def test_a_check_killed_with_sigkill_is_marked_incomplete_with_its_stage(tmp_path):
    """A real kill: `check` hangs in a backend (fault-hang sleeps 600 s on one case), is killed with SIGKILL once
    it wrote rows; its env.json says running, in correctness, and the report and history say so."""
    proc = subprocess.Popen([sys.executable, "-m", "harness", "check", "--matrix", "smoke", "--no-isolate",
                             "--backend-module", "tests/fixtures/faulty_backends.py", "--backends",
                             "naive,fault-hang", "--results-dir", str(tmp_path)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            runs = [p for p in tmp_path.iterdir() if (p / "results.csv").exists()]
            if runs and len((runs[0] / "results.csv").read_text().splitlines()) > 2:
                break
            assert proc.poll() is None, "check ended before it could be killed"
            time.sleep(0.5)
        else:
            pytest.fail("check wrote no rows in 300 s")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    env = read_env(runs[0])
    assert env["status"] == RUNNING and env["stage"] == "correctness" and "time_spent" not in env
    assert "stopped during the correctness stage" in _text(load_run(runs[0]))
    assert "stopped during the correctness stage" in history_text(load_history(tmp_path))
