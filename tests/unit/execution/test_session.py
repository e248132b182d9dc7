"""The run session built from the options (the suites' and check's one entry) and its parts: the recorder (run dir,
writers, env.json), the verdict memory, the timing-round schedule and the run's caches (CPU, no timing)."""

import ast
import json
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from harness.backends.naive import Naive
from harness.calls.cache import LRU, RunCaches, cached
from harness.isolation.in_process import InProcessExecutor
from harness.isolation.supervisor import IsolatedExecutor
from harness.calls.outcome import BackendResult
from harness.run.recorder import RunRecorder
from harness.run.rounds import Round, RoundSchedule
from harness.run.session import RunSession
from harness.measure.measurement import Measurement
from harness.measure.timing import TimingConfig
from harness.cases.case import AttentionCase
from harness.store.load import load_results
from harness.store.schema import Row, TimingKey

CPU = torch.device("cpu")
CASE = AttentionCase(1, 2, 8, 8, "fp32")
HARNESS = Path(__file__).resolve().parents[3] / "harness"


def _options(tmp_path, **given) -> Namespace:
    """The names cli/options.py defines, as check's parser leaves them (no timing options)."""
    base = dict(results_dir=str(tmp_path), seed=3, isolate=False, call_timeout_s=[], preset=None, hf_config=None,
                backend_module=[])
    return Namespace(**{**base, **given})


def test_from_options_builds_the_whole_session_before_it_is_handed_out(tmp_path):
    """Executor, timing, rounds and the cases' description come from the options; nothing is assigned later."""
    options = _options(tmp_path, isolate=True, call_timeout_s=[("*", 40.0), ("bf16-*", 900.0)],
                       timing_budget_ms=80.0, cuda_graph=False, rounds=2, cpu_mem_budget_gb=0.5,
                       benchmark_enabled=False)
    session = RunSession.from_options(options, CPU, [CASE], "smoke")
    try:
        assert isinstance(session.executor, IsolatedExecutor)
        assert (session.executor.timeout_s, session.executor.timeouts) == (40.0, (("bf16-*", 900.0),))
        assert session.executor.log_dir == str(session.run_dir / "workers")
        assert session.schedule.timing == TimingConfig(warmup_ms=20.0, budget_ms=80.0)
        assert session.rounds == 2 and session.cpu_mem_budget == 2 ** 29 and session.seed == 3
        env = json.loads((session.run_dir / "env.json").read_text())
        assert env["cases"] == {"matrix": "smoke"} and env["rounds"] == 2 and env["seed"] == 3
        assert env["run_id"] == session.run_id == session.run_dir.name
    finally:
        session.finish()


def test_a_run_keeps_the_plugin_files_it_was_given(tmp_path):
    """env.json names each --backend-module's copy in the run folder and its sha256 (store/kernels.py)."""
    plugin = tmp_path / "my_attn.py"
    plugin.write_text("# a plugin module\n")
    session = RunSession.from_options(_options(tmp_path / "results", backend_module=[str(plugin)]), CPU, [CASE],
                                      "smoke")
    try:
        (kept,) = json.loads((session.run_dir / "env.json").read_text())["backend_sources"]
        assert kept["module"] == str(plugin.resolve()) and kept["copy"] == "kernels/00/my_attn.py"
        assert (session.run_dir / kept["copy"]).read_text() == "# a plugin module\n" and len(kept["sha256"]) == 64
    finally:
        session.finish()


def test_from_options_without_timing_options_is_check_s_session(tmp_path):
    session = RunSession.from_options(_options(tmp_path, preset="llama-3-8b"), CPU, [CASE], "smoke")
    assert type(session.executor) is InProcessExecutor and session.rounds == 1
    assert session.schedule.timing == TimingConfig() and session.env["cases"] == {"preset": "llama-3-8b"}
    result = session.check(CASE, Naive())
    session.finish()
    assert [r.status for r in result.rows] == ["pass", "pass"]
    assert list(load_results(session.run_dir).status) == ["pass", "pass"]
    assert "time_spent" in json.loads((session.run_dir / "env.json").read_text())


def test_a_folderless_session_writes_only_its_results_path(tmp_path):
    path = tmp_path / "rows.csv"
    session = RunSession(CPU, None, run_id="", results_path=path)
    session.check(CASE, Naive())
    session.finish()
    assert session.run_dir is None and sorted(p.name for p in tmp_path.iterdir()) == ["rows.csv"]
    assert len(load_results(path)) == 2


def test_the_plugin_builds_its_session_with_from_options():
    """The plugin only wires pytest hooks: it neither constructs a RunSession nor assigns its parts."""
    source = (HARNESS / "suite" / "plugin.py").read_text()
    assert "RunSession.from_options(" in source
    assert "RunSession(" not in source.replace("RunSession.from_options(", "")
    assert "session.executor =" not in source and "describe_cases" not in source and "measure_peaks" not in source


def test_a_later_benchmark_round_reads_the_verdict_the_session_remembers(tmp_path):
    session = RunSession(CPU, tmp_path)
    first = session.verdict(CASE, Naive())
    assert session.verdict(CASE, Naive()) is session.verdicts.get((CASE.id, "naive")) and first.out is None
    session.finish()
    assert len(load_results(session.run_dir)) == 2  # judged once


def _row(status="timed", suspicious=False, reason="", mem=(10, "m")) -> Row:
    return Row(run_id="", case_id=CASE.id, backend="x", phase="fwd", status=None, timing_status=status,
               timing_reason=reason, suspicious=suspicious, peak_mem_bytes=mem[0], mem_method=mem[1])


def test_the_schedule_hands_each_round_what_the_earlier_rounds_found():
    schedule, key = RoundSchedule(TimingConfig(), 3), TimingKey(CASE.id, "x", "fwd")
    assert schedule.next(key, 0) == Round(0, 3)
    one = Measurement((1.0,), "cpu-clock", 1)
    schedule.record(_row(suspicious=True, reason="suspicious: 9 TFLOP/s"), one)
    assert schedule.next(key, 1) == Round(1, 3, one, "suspicious: 9 TFLOP/s", (10, "m"))
    two = Measurement.merge([one, Measurement((2.0,), "cpu-clock", 1)])
    schedule.record(_row(suspicious=True, reason="suspicious: 9 TFLOP/s", mem=(10, "m")), two)
    assert schedule.next(key, 2).pooled is two and schedule.rows[key].suspicious
    schedule.record(_row(status="error", reason="round 3 of 3: ..."), None)
    assert schedule.next(key, 2) is None  # a round not timed ends its key
    with pytest.raises(ValueError, match="rounds=0"):
        RoundSchedule(TimingConfig(), 0)


def test_the_recorder_keeps_samples_and_env_only_in_a_run_folder(tmp_path):
    key = TimingKey(CASE.id, "x", "fwd")
    folder = RunRecorder("r1", tmp_path / "r1", {"a": 1})
    folder.write([_row()])
    folder.write_samples(key, [1.0, 2.0], round_index=1)
    folder.add_test_seconds("benchmark", 2.0)
    folder.finish(clocks_end={})
    env = json.loads((tmp_path / "r1" / "env.json").read_text())
    assert env["a"] == 1 and env["time_spent"]["tests_s"] == {"benchmark": 2.0}
    assert len((tmp_path / "r1" / "samples.csv").read_text().splitlines()) == 3
    bare = RunRecorder("r2")
    bare.write([_row()])
    bare.write_samples(key, [1.0], round_index=0)
    bare.finish()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r1"]
    with pytest.raises(ValueError, match="run folder or to one results_path"):
        RunRecorder("r3", tmp_path / "r3", results_path=tmp_path / "x.csv")


def test_caches_are_bounded_and_die_with_their_session(tmp_path):
    made = []
    lru = LRU(2)
    for key in "abca":
        lru.get(key, lambda k=key: made.append(k) or k)
    assert made == ["a", "b", "c", "a"] and len(lru) == 2  # 'a' was evicted by 'c', then made again
    assert cached(None, "a", lambda: 1) == 1  # no cache: made afresh
    session = RunSession(CPU, tmp_path)
    session.prepared(CASE)
    assert CASE in session.cache.prepared
    session.finish()
    assert len(session.cache.prepared) == 0
    assert isinstance(RunSession(CPU, tmp_path / "b").cache, RunCaches)
    assert InProcessExecutor().caches is not InProcessExecutor().caches  # each executor draws its own inputs


def test_no_module_keeps_a_cache_of_its_own():
    """Inputs and prepared cases are cached only in a run's (or a worker's) LRUs, never in a module-level dict or
    LRU that outlives the run: every `LRU(...)` is made inside a function, a class or a dataclass field."""
    #: process-wide on purpose, and no cache: the backends registered by name (plugin modules add to it)
    #: and, as process-wide as the registry, the module each plugin backend came from and each plugin module's process
    allowed = {"backends/registry.py: _REGISTRY: dict[str, Backend] = {}",
               "backends/registry.py: _ORIGIN: dict[str, str] = {}",
               "isolation/plugin_host.py: _HOSTS: dict[str, 'PluginHost'] = {}"}
    offenders = []
    for path in HARNESS.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                text = ast.unparse(node.value)
                if text.startswith(("LRU(", "{}", "dict(", "OrderedDict(")):
                    offenders.append(f"{path.relative_to(HARNESS)}: {ast.unparse(node)}")
    assert set(offenders) <= allowed, sorted(set(offenders) - allowed)


def test_a_run_started_in_another_checkout_of_the_harness_refuses_to_start(tmp_path, monkeypatch):
    """docs/regressions.md's CI recipe made its base run in ../base with main's venv: it timed main's code and
    recorded main's commit. A run started in a checkout whose harness is not the one imported refuses, naming both."""
    other = tmp_path / "base"
    (other / "harness").mkdir(parents=True)
    (other / "harness" / "__init__.py").write_text("")
    (other / "suites").mkdir()
    monkeypatch.chdir(other)
    with pytest.raises(ValueError, match=f"started in the checkout {other}, but imports harness from "
                                         f"{HARNESS.parent}.*python -m pytest suites"):
        RunSession.from_options(_options(tmp_path / "results"), CPU, [CASE], "smoke")
    assert not (tmp_path / "results").exists()
    monkeypatch.chdir(HARNESS.parent / "docs")  # anywhere in this checkout is this checkout
    RunSession.from_options(_options(tmp_path / "results"), CPU, [CASE], "smoke").finish()
