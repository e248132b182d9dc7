"""Sharded real runs: the shards of `pytest suites --shard i/n` merge into exactly the unsharded run's rows."""

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.launch.merge import merge_runs, shard_run_dir
from harness.cases.matrices import build_matrix
from harness.store.load import load_results

SMOKE = len(build_matrix("smoke"))  # cases of the smoke matrix these runs use

ROOT = Path(__file__).resolve().parents[2]


def test_merge_of_real_shard_runs_equals_unsharded_run(tmp_path):
    n = 3
    base = [sys.executable, "-m", "pytest", "suites", "-p", "no:cacheprovider", "-q", "--matrix", "smoke",
            "--backends", "naive,sdpa-math", "--device", "cpu"]
    runs = {"all": base + ["--results-dir", str(tmp_path / "all")]}
    runs.update({i: base + ["--shard", f"{i}/{n}", "--results-dir", str(tmp_path / f"shard-{i}")] for i in range(n)})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # four processes on a small CI box: one thread each
    procs = {name: subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    env=env) for name, cmd in runs.items()}
    for name, proc in procs.items():
        out = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0, (name, out[-2000:])
    unsharded = load_results(shard_run_dir(tmp_path / "all"))
    shard_dirs = [shard_run_dir(tmp_path / f"shard-{i}") for i in range(n)]
    merged = merge_runs(shard_dirs, tmp_path / "merged")

    def rows(df):
        return sorted(map(tuple, df[["case_id", "backend", "phase", "status"]].values))
    assert len(unsharded) == SMOKE * 2 * 2
    assert rows(merged) == rows(unsharded)
    assert set(merged.run_id) == {"merged"}
    env = json.loads((tmp_path / "merged" / "env.json").read_text())
    assert env["run_id"] == "merged" and len(env["shards"]) == n
    assert sum(s["rows"] for s in env["shards"]) == len(unsharded)
    assert env["testbed_id"] == json.loads((shard_dirs[0] / "env.json").read_text())["testbed_id"]
