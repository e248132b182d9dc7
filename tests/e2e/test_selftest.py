"""The GPU acceptance run's CPU stand-in, end to end: `scripts/gpu-acceptance.sh --dry-run` prints the environment
and runs `selftest --gpu --dry-run --budget-s 120`, whose every step runs, is skipped or is listed as not run
within its budget, and leaves the table, the archive and 6 files.

Step outcomes that depend on this machine's speed (a TIMEOUT, a step the budget left out) are allowed; what is
asserted is what the run must do whatever the speed: stay within its budget, never FAIL, write what it did."""

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def test_gpu_acceptance_dry_run_fits_its_budget_and_leaves_the_record(tmp_path):
    out = tmp_path / "out"
    start = time.monotonic()
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-acceptance.sh"), "--dry-run", str(out),
                          str(tmp_path / "no-wheelhouse")], cwd=ROOT, capture_output=True, text=True, timeout=400,
                         env={**os.environ, "PYTHON": sys.executable})
    took = time.monotonic() - start
    assert res.returncode in (0, 1), res.stdout[-3000:] + res.stderr[-2000:]
    assert took < 120 + 60  # the selftest's budget, plus the environment and start-up
    files = sorted(p.name for p in out.iterdir() if p.is_file())
    assert files == ["acceptance.log", "environment.txt", "install.log", "selftest-table.txt", "selftest.json",
                     "selftest.tgz"]
    assert "; torch " in (out / "environment.txt").read_text() and "GPUs: " in (out / "environment.txt").read_text()
    steps = json.loads((out / "selftest.json").read_text())
    assert list(steps) == ["backends", "tests/gpu", "correctness smoke", "benchmark smoke (1 round)",
                           "fidelity vs a wall clock", "--cuda-graph", "cuda:1", "run --cpu-shards 2"]
    allowed = ("ok", "skipped", "not run", "TIMEOUT")
    assert all(v["status"].startswith(allowed) for v in steps.values()), steps
    assert steps["backends"]["detail"].startswith("ok: naive, sdpa")
    assert {k for k, v in steps.items() if v["status"] == "skipped"} == {"--cuda-graph", "cuda:1"}
    assert sum(v["seconds"] for v in steps.values()) <= 120 + 15  # each step's timeout is cut to the budget
    assert steps["run --cpu-shards 2"]["status"] == "not run"  # the plan keeps a fifth of the budget as slack
    table = (out / "selftest-table.txt").read_text()
    # the GPU main job's cost on an H200, by the cost model (issue 33)
    from harness.cli.node.selftest import gpu_matrix_estimate
    assert gpu_matrix_estimate().startswith("the gpu matrix on an H200 (its measured rates, 7 backends, 3 rounds): "
                                            "15 cases, ~8.9 min")
    assert gpu_matrix_estimate() in (out / "acceptance.log").read_text()
    assert "budget 120 s" in table and table.splitlines()[-1].startswith(("not run: ", "every planned step ran"))
    with tarfile.open(out / "selftest.tgz") as tar:
        names = tar.getnames()
    assert {"selftest-table.txt", "selftest.json", "step-backends.log"} <= set(names)
    if steps["correctness smoke"]["status"] == "ok":
        assert steps["correctness smoke"]["detail"].startswith("pass")
        assert any(n.endswith("results.csv") for n in names) and any(n.endswith("env.json") for n in names)


def test_selftest_without_a_gpu_says_so():
    res = subprocess.run([sys.executable, "-m", "harness", "selftest", "--gpu"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 2 and "needs a CUDA device" in res.stderr and "--dry-run" in res.stderr
