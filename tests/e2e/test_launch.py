"""`python -m harness run`: CPU shards for real, the Slurm path through submitit's local executor, bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.launch.local import check_pytest_args, parse_gpus, shard_command
from harness.launch.merge import ShardFailed, merge_shards, shard_root, write_exit_status
from harness.cases.matrices import build_matrix
from harness.store.load import load_results
from tests.fixtures.regress_fixtures import key, write_run

SMOKE = len(build_matrix("smoke"))  # cases of the smoke matrix these runs use

ROOT = Path(__file__).resolve().parents[2]


def harness(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def merged_run(results_dir: Path) -> Path:
    runs = [p for p in results_dir.iterdir() if (p / "results.csv").exists()]
    assert len(runs) == 1, runs
    return runs[0]


def test_cpu_shards_run_and_merge(tmp_path):
    res = harness("run", "--cpu-shards", "2", "--results-dir", str(tmp_path), "--", "--matrix", "smoke",
                  "--backend-module", "tests/fixtures/broken_backends.py", "--backends", "naive,broken-scale")
    assert res.returncode == 1, res.stdout + res.stderr  # a failing test in a shard fails the run, as pytest would
    run = merged_run(tmp_path)
    df = load_results(run)
    assert len(df) == SMOKE * 2 * 2 and set(df.run_id) == {run.name}
    assert set(df[df.backend == "naive"].status) == {"pass"} and set(df[df.backend != "naive"].status) == {"fail"}
    shards = json.loads((run / "env.json").read_text())["shards"]
    # the cases split as evenly as they go (the first shard takes the odd one), 2 backends and 2 phases each
    assert [s["rows"] for s in shards] == [4 * -(-SMOKE // 2), 4 * (SMOKE // 2)]
    assert "shard 1/2 exited 1" in res.stdout
    assert f"results: {run / 'results.csv'} ({SMOKE * 4} rows from 2 shards)" in res.stdout


def test_only_finished_complete_shards_are_merged(tmp_path):
    run = tmp_path / "run"
    roots = [shard_root(run, i, 2) for i in range(2)]
    for i, root in enumerate(roots):
        write_run(root / f"r{i}", {key(i): {}})
        tail = "Interrupted: killed by the OOM killer\n" if i else ""
        root.with_suffix(".log").write_text("collected 4 items\n" + tail)
    write_exit_status(roots[0], 0)
    with pytest.raises(ShardFailed, match=r"shard 1/2 has not finished \(no shard-1.exit\)"):
        merge_shards(run, 2)  # still running: its partial rows must not be merged
    write_exit_status(roots[1], 2)
    with pytest.raises(ShardFailed, match=r"(?s)1 of 2 shards unfinished or failed; not merged.*"
                                          r"shard 1/2 exited 2 \(log .*shard-1.log\).*OOM killer"):
        merge_shards(run, 2)
    assert not (run / "results.csv").exists()
    write_exit_status(roots[1], 5)  # pytest found no case in that shard: complete
    assert len(merge_shards(run, 2)) == 2


@pytest.mark.parametrize("args, needle", [
    (["--gpus", "all"], "no CUDA device is visible"),
    (["--cpu-shards", "2", "--", "--device", "cpu"], "pytest argument '--device'"),
    (["--cpu-shards", "2", "--", "--shard=0/2"], "pytest argument '--shard=0/2'"),
    (["--cpu-shards", "0"], "argument --cpu-shards: must be an integer >= 1; got 0"),
    (["--slurm", "2", "--slurm-cluster", "local", "--", "--results-dir", "x"], "pytest argument '--results-dir'"),
])
def test_bad_input_is_a_one_line_error(tmp_path, capsys, args, needle):
    assert main(["run", "--results-dir", str(tmp_path), *args]) == 2
    assert needle in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before anything started


def test_gpu_selection_and_commands():
    assert parse_gpus("all", 4) == [0, 1, 2, 3] and parse_gpus("0,2", 4) == [0, 2]
    for spec in ("4", "0,0", "x", ""):
        with pytest.raises(ValueError, match="--gpus"):
            parse_gpus(spec, 4)
    assert check_pytest_args(["--", "--matrix", "smoke"]) == ["--matrix", "smoke"]
    cmd = shard_command(1, 4, ["--matrix", "smoke"], Path("r/shards/shard-1"), device="cuda:0")
    assert cmd[-6:] == ["--shard", "1/4", "--results-dir", "r/shards/shard-1", "--device", "cuda:0"]


def test_slurm_array_through_submitit_local_executor(tmp_path):
    pytest.importorskip("submitit", reason="submitit (the 'slurm' extra) is not installed")
    res = harness("run", "--slurm", "2", "--slurm-cluster", "local", "--slurm-time-min", "10",
                  "--results-dir", str(tmp_path), "--", "--matrix", "smoke", "--backends", "naive,sdpa-math")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "submitted 2 shards" in res.stdout and "(local)" in res.stdout
    run = merged_run(tmp_path)
    df = load_results(run)
    assert len(df) == SMOKE * 2 * 2 and set(df.status) == {"pass"}
    assert len(json.loads((run / "env.json").read_text())["shards"]) == 2
    assert (run / "submitit").is_dir()  # submitit's own logs of each array task stay with the run
