"""The acceptance run's budget: steps planned to fit in order, each step's timeout, a step killed at its timeout
with its workers, and the table on disk after every step (what a run killed at any moment leaves)."""

import json
import os
import sys
import tarfile
import time

import pytest

from harness.cli.node import selftest
from harness.cli.node.selftest_plan import STEP_KEYS, Step, choose, fit, steps, timeout_for


def _steps(*estimates):
    return [Step(f"s{i}", f"step {i}", [sys.executable, "-c", "pass"], e) for i, e in enumerate(estimates)]


def test_fit_keeps_the_first_steps_that_fit_and_says_why_the_others_did_not_run():
    planned = _steps(40, 24, 40, 10)
    fit(planned, 100)  # the plan fills 80 s of it
    assert [bool(s.skip) for s in planned] == [False, False, True, False]  # the cheaper last step still fits
    assert planned[2].skip == "not run: over budget (~40 s needed, 16 s of the plan's 80 left; --budget-s 100)"


def test_timeout_leaves_the_later_steps_their_estimates():
    planned = _steps(20, 30, 40)
    assert timeout_for(planned[0], planned[1:], left_s=200) == 40  # twice its estimate
    assert timeout_for(planned[0], planned[1:], left_s=90) == 20  # 90 - (30 + 40)


def test_every_step_is_planned_most_informative_first_and_the_dry_run_fits_120_s(tmp_path):
    planned = steps(True, tmp_path, 0, ["naive", "sdpa"])
    assert [s.key for s in planned] == list(STEP_KEYS)
    fit(planned, 120)
    assert [s.key for s in planned if s.skip.startswith("not run")] == ["launch"]
    gpu = steps(False, tmp_path, 1, ["naive", "sdpa", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn",
                                     "flex", "xformers"])
    fit(gpu, 480)
    assert sum(s.estimate_s for s in gpu if not s.skip) <= 0.8 * 480 and gpu[-1].skip.startswith("not run: over")
    # a suites step is priced per backend by the whole-job model at the GPU's unit costs (one cost model for all)
    from harness.backends.registry import get_backends
    from harness.cases.matrices import build_matrix
    from harness.planning.fitted import backend_seconds
    names = ["naive", "sdpa", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flex", "xformers"]
    priced = backend_seconds(build_matrix("gpu-smoke"), tuple(get_backends(names)), "cuda", timed=False)
    correctness = next(s for s in gpu if s.key == "correctness")
    assert not correctness.skip and correctness.estimate_s == pytest.approx(70 + sum(priced.values()))
    assert correctness.least_s == pytest.approx(70 + priced["naive"])
    # the benchmark step judges its cases again, then times them: a larger share a backend, and over what is left
    benchmark = next(s for s in gpu if s.key == "benchmark")
    timed = backend_seconds(build_matrix("gpu-smoke"), tuple(get_backends(names)), "cuda", timed=True)
    assert benchmark.skip.startswith("not run: over") and benchmark.estimate_s == pytest.approx(30 + sum(timed.values()))
    assert all(timed[n] > priced[n] for n in names)


def test_steps_names_must_be_known():
    with pytest.raises(ValueError, match="--steps nope: allowed backends, tests-gpu, correctness"):
        choose(_steps(1), ["nope"])


def test_a_step_past_its_timeout_is_killed_with_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    code = (f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); open({str(pid_file)!r}, 'w')"
            ".write(str(p.pid)); time.sleep(60)")
    step = Step("hang", "hang", [sys.executable, "-c", code], 1)
    start = time.monotonic()
    outcome = selftest.run_step(step, lambda line: None, tmp_path, timeout_s=2)
    assert outcome["status"] == "TIMEOUT (2 s)" and time.monotonic() - start < 15
    child = int(pid_file.read_text())
    time.sleep(0.2)
    assert not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z"


def test_the_table_on_disk_says_what_finished_and_what_did_not_run(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    planned = _steps(1, 1, 1, 1)
    planned[3].skip = "dry run: needs a CUDA device"
    planned[0].outcome = {"status": "ok", "seconds": 3.0, "detail": "fine"}
    planned[1].skip = "not run: over budget"
    planned[1].outcome = {"status": "not run", "seconds": 0.0, "detail": planned[1].skip}
    (work / "step-step-0.log").write_text("log")
    selftest.write_record(tmp_path, work, planned, "title")
    text = (tmp_path / "selftest-table.txt").read_text()
    assert "step 0  ok" in text and "step 2  pending" in text and text.endswith("not run: step 1, step 2\n")
    assert "step 3  skipped" in text
    assert json.loads((tmp_path / "selftest.json").read_text())["step 2"] == {"status": "pending"}
    with tarfile.open(tmp_path / "selftest.tgz") as tar:
        assert set(tar.getnames()) == {"selftest-table.txt", "selftest.json", "step-step-0.log"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["selftest-table.txt", "selftest.json", "selftest.tgz",
                                                          "work"]


def test_a_step_stopped_at_its_timeout_reports_the_rows_it_finished(tmp_path):
    """An H200 run (2026-12-04) stopped its correctness step at the timeout with 88 rows written; the table read only
    a warning line. The rows are the result: counted, the status still the timeout."""
    results = tmp_path / "correct"
    run = results / "run-1"
    code = (f"import os, time; os.makedirs({str(run)!r}); open({str(run / 'results.csv')!r}, 'w').write("
            "'backend,status\\nnaive,pass\\nsdpa,pass\\nsdpa,fail\\n'); print('a warning'); time.sleep(60)")
    step = Step("correctness", "correctness", [sys.executable, "-c", code], 1, results=results)
    outcome = selftest.run_step(step, lambda line: None, tmp_path, timeout_s=3)
    assert outcome["status"] == "TIMEOUT (3 s)" and outcome["detail"] == "pass 2, fail 1", outcome
