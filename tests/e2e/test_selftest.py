"""The GPU acceptance command's CPU stand-in (`selftest --gpu --dry-run`): every step runs or says why not."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def test_selftest_dry_run_runs_every_step_it_can(tmp_path):
    res = subprocess.run([sys.executable, "-m", "harness", "selftest", "--gpu", "--dry-run", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    steps = json.loads((tmp_path / "selftest.json").read_text())
    assert list(steps) == ["backends", "tests/gpu", "suites smoke --benchmark", "--cuda-graph", "cuda:1",
                           "memory growth", "run --cpu-shards 2"]
    assert {k for k, v in steps.items() if v["status"] == "skipped"} == {"--cuda-graph", "cuda:1"}
    assert "peak memory x" in steps["memory growth"]["detail"] and "pass" in steps["run --cpu-shards 2"]["detail"]
    assert "selftest --dry-run (CPU stand-in)" in res.stdout
    assert steps["backends"]["detail"].startswith("ok: naive, sdpa") and "flash-attn" in steps["backends"]["detail"]
    # where each run's time went: the suites step's run and each launcher shard's
    spent = steps["suites smoke --benchmark"]["time_spent"]
    assert len(spent) == 1 and {"reference", "forward", "timing"} <= set(next(iter(spent.values()))["stages"])
    assert len(steps["run --cpu-shards 2"]["time_spent"]) == 2 and "  by stage: " in res.stdout


def test_selftest_without_a_gpu_says_so():
    res = subprocess.run([sys.executable, "-m", "harness", "selftest", "--gpu"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 2 and "needs a CUDA device" in res.stderr and "--dry-run" in res.stderr
