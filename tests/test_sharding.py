"""Sharding partitions the cases exactly; merging shard runs gives an unsharded run's rows, refusing overlaps."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.matrices import MATRICES, build_matrix
from harness.merge import merge_runs, shard_run_dir
from harness.results import load_results, load_samples
from harness.sharding import parse_shard, select_shard
from regress_fixtures import key, lognormal, write_run

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("matrix", MATRICES)
@pytest.mark.parametrize("n", [1, 2, 3, 7, 64])
def test_shards_partition_the_cases(matrix, n):
    cases = build_matrix(matrix)
    shards = [select_shard(cases, i, n) for i in range(n)]
    ids = [c.id for shard in shards for c in shard]
    assert len(ids) == len(set(ids)) == len(cases)  # no overlap, nothing lost
    assert set(ids) == {c.id for c in cases}
    assert max(map(len, shards)) - min(map(len, shards)) <= 1  # balanced


@pytest.mark.parametrize("spec", ["3/3", "-1/2", "1", "a/b", "0/0", ""])
def test_bad_shard_specs(spec):
    with pytest.raises(ValueError, match="expected i/n with 0 <= i < n"):
        parse_shard(spec)


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
    assert len(unsharded) == 8 * 2 * 2
    assert rows(merged) == rows(unsharded)
    assert set(merged.run_id) == {"merged"}
    env = json.loads((tmp_path / "merged" / "env.json").read_text())
    assert env["run_id"] == "merged" and len(env["shards"]) == n
    assert sum(s["rows"] for s in env["shards"]) == len(unsharded)
    assert env["testbed_id"] == json.loads((shard_dirs[0] / "env.json").read_text())["testbed_id"]


def test_merge_concatenates_samples(tmp_path):
    a = write_run(tmp_path / "a", {key(0): {}}, {key(0): lognormal(1, n=10)})
    b = write_run(tmp_path / "b", {key(1): {}, key(2): {}}, {key(1): lognormal(2, n=7)})
    merged = merge_runs([a, b], tmp_path / "out")
    assert len(merged) == 3
    samples = load_samples(tmp_path / "out")
    assert len(samples) == 17 and set(samples.run_id) == {"out"}


def test_merge_refuses_duplicate_keys(tmp_path):
    a = write_run(tmp_path / "a", {key(0): {}, key(1): {}})
    b = write_run(tmp_path / "b", {key(1): {}, key(2): {}})
    with pytest.raises(ValueError, match=r"1 key\(s\) appear in more than one shard.*s65"):
        merge_runs([a, b], tmp_path / "out")
    assert not (tmp_path / "out" / "results.csv").exists()


def test_merge_refuses_mixed_testbeds_unless_allowed(tmp_path):
    a = write_run(tmp_path / "a", {key(0): {}}, testbed="tb-a100")
    b = write_run(tmp_path / "b", {key(1): {}}, testbed="tb-h100")
    with pytest.raises(ValueError, match=r"2 testbeds \['tb-a100', 'tb-h100'\]"):
        merge_runs([a, b], tmp_path / "out")
    merge_runs([a, b], tmp_path / "out", allow_mixed_testbeds=True)
    assert json.loads((tmp_path / "out" / "env.json").read_text())["testbed_id"] == "tb-a100+tb-h100"


def test_merge_refuses_to_overwrite(tmp_path):
    a = write_run(tmp_path / "a", {key(0): {}})
    merge_runs([a], tmp_path / "out")
    with pytest.raises(ValueError, match="already exists"):
        merge_runs([a], tmp_path / "out")
