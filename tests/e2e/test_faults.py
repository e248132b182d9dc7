"""Backends that crash, hang or lie, run as a user would: every fault is a row with its reason, the sweep goes on,
and nothing finished is lost when the run itself is killed."""

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

from harness.cases.matrices import build_matrix
from harness.store.load import load_results
from harness.store.run_dir import read_env
from harness.store.run_state import incomplete
from tests.fixtures.faulty_backends import FAULTS
from tests.e2e import the_run

SMOKE = len(build_matrix("smoke"))  # cases of the smoke matrix these runs use

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "tests/fixtures/faulty_backends.py"


def suites(tmp_path, *args, timeout=900):
    return subprocess.run([sys.executable, "-m", "pytest", "suites/correctness", "-p", "no:cacheprovider", "-q",
                           "--matrix", "smoke", "--results-dir", str(tmp_path), "--backend-module", PLUGIN, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_every_fault_is_a_row_and_the_sweep_goes_on(tmp_path):
    res = suites(tmp_path, "--backends", ",".join(["naive", *FAULTS]), "--call-timeout-s", "10")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]  # failures, not a crash of the run
    df = load_results(the_run(tmp_path))
    assert len(df) == SMOKE * (1 + len(FAULTS)) * 2  # every case x backend x phase has its row
    by = df.set_index(["backend", "case_id", "phase"])
    assert set(df[df.backend == "naive"].status) == {"pass"}  # cases after each crash still ran

    def rows(backend):
        return df[df.backend == backend]

    assert set(rows("fault-segfault").status) == {"error"}
    def every(backend, text, frame=None):
        return (frame if frame is not None else rows(backend)).reason.str.contains(text, regex=False).all()

    assert every("fault-segfault", "the worker process died (signal SIGSEGV)")
    assert every("fault-exit", "the worker process exited with status 7")
    assert every("fault-none", "forward returned NoneType, not a tensor")
    assert every("fault-sysexit", "SystemExit(3) raised inside the backend call")
    dtype = rows("fault-dtype")
    assert set(dtype.status) == {"fail"}
    assert every(None, "output dtype float64, expected float32 (the input dtype)", dtype[dtype.dtype == "fp32"])
    assert every(None, "output dtype float16, expected bfloat16 (the input dtype)", dtype[dtype.dtype == "bf16"])
    assert set(rows("fault-shape").status) == {"fail"} and every("fault-shape", "output shape (2, 4, ")
    hung = by.loc[("fault-hang", "fp32-b2-h4-s161-d32-causal", "fwd")]
    assert hung.status == "error" and "timed out after 10 s" in hung.reason
    others = rows("fault-hang")[rows("fault-hang").case_id != "fp32-b2-h4-s161-d32-causal"]
    assert set(others.status) == {"pass"}  # the restarted worker answered the cases after the hang


def test_a_backend_raising_keyboardinterrupt_is_recorded_then_stops_the_run(tmp_path):
    res = suites(tmp_path, "--backends", "naive,fault-interrupt")
    assert res.returncode == 2 and "fault-interrupt raised KeyboardInterrupt" in res.stdout, res.stdout[-2000:]
    df = load_results(the_run(tmp_path))
    assert len(df) == 2 * 2  # naive and the interrupting backend on the first case, both phases, then the stop
    assert set(df[df.backend == "fault-interrupt"].reason) == {"KeyboardInterrupt inside the backend call"}
    # the run knows it did not reach its end (issue 35)
    assert incomplete(read_env(the_run(tmp_path))) == "interrupted during the correctness stage"


def test_a_killed_run_keeps_every_finished_row(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "suites/correctness", "-p", "no:cacheprovider", "-q",
                             "--matrix", "default", "--backends", "naive,sdpa-math", "--results-dir", str(tmp_path)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 300
        results = None
        while time.time() < deadline:
            found = list(tmp_path.glob("*/results.csv"))
            if found and found[0].read_text().count("\n") > 20:
                results = found[0]
                break
            time.sleep(0.5)
        assert results is not None, "the run wrote no rows in time"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the run and its workers, as a crash or an OOM killer would
        proc.wait(timeout=60)
    lines = results.read_text().splitlines()
    with warnings.catch_warnings(record=True) as caught:  # a line cut short by the kill is dropped, with a warning
        warnings.simplefilter("always")
        df = load_results(results.parent)
    assert len(df) >= 20 and set(df.status) == {"pass"}  # every finished row loads
    assert len(df) >= len(lines) - 2 - len(caught)  # header, and at most one line cut short
    assert df[["case_id", "backend", "phase"]].notna().all().all()
    # and it says it was stopped, and where (issue 35): env.json as written at the stage boundary, no end
    env = read_env(results.parent)
    assert env["status"] == "running" and env["stage"] == "correctness" and "time_spent" not in env
    assert incomplete(env) == "stopped during the correctness stage (killed or crashed: no end recorded)"
