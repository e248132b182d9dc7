"""Sharding partitions the cases exactly; merging shard runs gives an unsharded run's rows, refusing overlaps."""

import json
from pathlib import Path

import pytest

from harness.cases.matrices import MATRICES, build_matrix
from harness.launch.merge import merge_runs
from harness.store.load import load_samples
from harness.launch.sharding import parse_shard, select_shard
from tests.fixtures.regress_fixtures import key, lognormal, write_run

ROOT = Path(__file__).resolve().parents[3]


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
