"""history: every run dir under a results directory in one frame, env fields on each row, a per-run summary."""

import json
import sys

import pytest
import torch

from harness.cli.main import main
from harness.store import environment as harness_env
from harness.store.environment import environment
from harness.store.host import snapshot_clocks
from harness.history.stored import load_history, summarize
from tests.fixtures.regress_fixtures import key, lognormal, write_run



@pytest.fixture
def results(tmp_path):
    a = write_run(tmp_path / "run-a", {key(i): {} for i in range(3)}, {key(0): lognormal(1)}, host="gpu-box",
                  testbed="tb-1", torch_version="2.5.0", started="2026-01-01T00:00:00+00:00")
    write_run(tmp_path / "run-b", {**{key(i): {} for i in range(4)}, key(1): {"status": "fail", "reason": "x"}},
              host="other-box", testbed="tb-2", torch_version="2.6.0", started="2026-02-01T00:00:00+00:00")
    # a launcher keeps its shards under <run>/shards/: their rows are already in the merged run
    write_run(a / "shards" / "shard-0" / "s0", {key(9): {}})
    (tmp_path / "notes").mkdir()  # not a run dir: ignored
    return tmp_path


def test_load_history_adds_env_fields(results):
    df = load_history(results)
    assert len(df) == 7 and set(df.run_id) == {"run-a", "run-b"}
    a = df[df.run_id == "run-a"]
    assert set(a.host) == {"gpu-box"} and set(a.torch) == {"2.5.0"} and set(a.testbed_id) == {"tb-1"}
    assert set(df[df.run_id == "run-b"].host) == {"other-box"}
    assert "s73" not in " ".join(df.case_id)  # key(9) lives only in the shard


def test_summary_one_line_per_run(results):
    s = summarize(load_history(results))
    assert list(s.run_id) == ["run-a", "run-b"]  # oldest first
    assert list(s.rows) == [3, 4] and list(s["fail"]) == [0, 1] and list(s.timed) == [1, 0]


def test_a_run_stopped_before_its_first_row_is_listed_with_why(results):
    """An empty frame has no `incomplete` column values to test: the run's env.json must say it (it once did not)."""
    run = write_run(results / "run-c", {}, started="2026-03-01T00:00:00+00:00")
    env = json.loads((run / "env.json").read_text())
    (run / "env.json").write_text(json.dumps({**env, "status": "running", "stage": "probes"}))
    df = load_history(results)
    assert list(df[df.run_id == "run-c"].incomplete) == ["stopped during the probes stage (killed or crashed: no end "
                                                         "recorded)"]
    s = summarize(df).set_index("run_id")
    assert list(s.index) == ["run-a", "run-b", "run-c"] and s.loc["run-c", "complete"] == "no"


def test_broken_run_is_skipped_with_a_warning(results):
    (results / "run-c").mkdir()
    (results / "run-c" / "results.csv").write_text("not,a,harness,file\n1,2,3,4\n")
    with pytest.warns(UserWarning, match="skipping run .*run-c.*not a harness results file"):
        df = load_history(results)
    assert set(df.run_id) == {"run-a", "run-b"}


def test_missing_dir_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        load_history(tmp_path / "nope")


def test_cli(results, capsys):
    assert main(["history", str(results)]) == 0
    out = capsys.readouterr().out
    assert "run-a" in out and "other-box" in out
    assert "2 runs, 2 testbeds, 2 hosts, 7 rows" in out


# --- the environment fingerprint every run records (harness/env.py) ---

REQUIRED_ENV = ("device_name", "device_type", "cpu_model", "threads", "cpu_count", "host", "torch", "torch_git",
                "cuda", "cudnn", "triton", "xformers", "flash_attn", "tf32_matmul", "tf32_cudnn", "sdpa_enabled",
                "git_sha", "git_dirty", "timing_mode", "testbed_id", "clocks_start", "started")


def test_environment_records_the_fingerprint():
    env = environment(torch.device("cpu"), timing_mode="cpu-clock")
    assert not [k for k in REQUIRED_ENV if k not in env]
    assert env["timing_mode"] == "cpu-clock" and env["threads"] == torch.get_num_threads()
    assert env["clocks_start"]["source"] == "cpu"
    json.dumps(env)  # env.json must be able to hold it


def test_testbed_id_follows_hardware_and_settings_not_software(monkeypatch):
    cpu = torch.device("cpu")
    before = harness_env.testbed_id(cpu)
    monkeypatch.setattr(torch, "__version__", "9.9.9")  # a torch upgrade is history, not a new testbed
    assert harness_env.testbed_id(cpu) == before
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)  # CPU kernels scale with threads: a different testbed
        assert harness_env.testbed_id(cpu) != before
    finally:
        torch.set_num_threads(threads)


def test_gpu_clock_snapshot_falls_back_to_nvidia_smi_then_unavailable(tmp_path, monkeypatch):
    gpu = torch.device("cuda", 0)  # a device object only: nothing here touches CUDA
    monkeypatch.setitem(sys.modules, "pynvml", None)  # NVML bindings absent
    monkeypatch.setenv("PATH", str(tmp_path))
    snap = snapshot_clocks(gpu)
    assert snap["source"] == "unavailable" and "nvml:" in snap["reason"] and "pynvml" in snap["reason"]
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 1980\n")  # every queried field answers 1980
    fake.chmod(0o755)
    snap = snapshot_clocks(gpu)
    assert snap["source"] == "nvidia-smi" and snap["sm_clock_mhz"] == "1980" and snap["throttle_reasons"] == "1980"
