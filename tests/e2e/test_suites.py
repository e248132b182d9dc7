"""`pytest suites` end to end: readable ids, skips with reasons, the CSV with its columns, bad options."""

import subprocess
import sys
from pathlib import Path

import pandas as pd

from harness.store.load import load_results
from harness.store.schema import COLUMNS
from harness.cases.matrices import build_matrix
from tests.e2e import the_run

ROOT = Path(__file__).resolve().parents[2]


def run_suites(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "suites", "-p", "no:cacheprovider", "-ra",
                           "--results-dir", str(tmp_path), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)


def test_smoke_run_writes_csv_and_skips_with_reasons(tmp_path):
    res = run_suites(tmp_path, "--matrix", "smoke", "--backends", "naive,sdpa-flash,xformers,flash-attn", "-v")
    assert res.returncode == 0, res.stdout[-3000:]
    assert "test_correctness[sdpa-flash-bf16-b2-h4-s161-d32-causal] PASSED" in res.stdout
    assert "xformers kernels need CUDA" in res.stdout and "flash_attn is not installed" in res.stdout
    run_dir = the_run(tmp_path)
    df = pd.read_csv(run_dir / "results.csv")
    assert list(df.columns) == list(COLUMNS)
    assert len(df) == len(build_matrix("smoke")) * 4 * 2  # cases x backends x phases, one row each
    assert set(df[df.backend.isin(["naive", "sdpa-flash"])].status) == {"pass"}
    assert set(df[df.backend.isin(["xformers", "flash-attn"])].status) == {"unavailable"}
    assert (run_dir / "env.json").exists()
    assert df.out_err.notna().sum() == df.dq_err.notna().sum() == len(build_matrix("smoke")) * 2


def test_plugin_checked_like_builtins(tmp_path):
    res = run_suites(tmp_path, "--matrix", "smoke", "--backend-module", "tests/fixtures/broken_backends.py",
                     "--backends", "broken-scale")
    assert res.returncode == 1
    assert "FAILED suites/correctness/test_correctness.py::test_correctness[broken-scale-fp32-b2-h4-s161-d32-none]" in res.stdout


def test_bad_option_is_a_usage_error(tmp_path):
    res = run_suites(tmp_path, "--backends", "sdpa,warp-attn")
    assert res.returncode == 4
    assert "unknown backend 'warp-attn'" in res.stderr


def test_performance_items_run_round_major_and_the_last_round_keeps_the_plain_id(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pytest", "suites/benchmark/test_performance.py", "-p", "no:cacheprovider",
                          "--collect-only", "-q", "--matrix", "smoke", "--backends", "naive", "--rounds", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:]
    ids = [line.split("[", 1)[1].rstrip("]") for line in res.stdout.splitlines() if "::test_performance[" in line]
    keys = len(ids) // 2
    assert keys == len(build_matrix("smoke")) * 3 and len(ids) == 2 * keys  # smoke cases x phases, twice
    assert all(i.endswith("-round1of2") for i in ids[:keys])  # every key's first round before any second one
    assert ids[keys:] == [i.removesuffix("-round1of2") for i in ids[:keys]]  # same order, plain ids


def test_bad_rounds_is_a_usage_error(tmp_path):
    res = run_suites(tmp_path, "--matrix", "smoke", "--rounds", "0")
    assert res.returncode == 4 and "argument --rounds: must be an integer >= 1; got 0" in res.stderr


def test_the_harness_summary_is_the_last_thing_printed_and_explains_its_columns(tmp_path):
    # one smoke case (-k) with two backends keeps this to seconds; the fidelity item is deselected by the same -k
    one = ["--matrix", "smoke", "--backends", "naive,sdpa-math", "--benchmark", "--rounds", "1",
           "--timing-budget-ms", "5", "--no-report", "-k", "fp32-b2-h4-s161-d32-none"]
    res = run_suites(tmp_path, *one)
    assert res.returncode == 0, res.stdout[-3000:]
    lines = res.stdout.splitlines()
    ours = max(i for i, line in enumerate(lines) if "attention harness" in line and line.startswith("="))
    integrity, *tail = lines[ours + 1:]
    assert integrity == "integrity: isolated: each backend's code only in its own worker processes"
    assert all(f"speedup vs naive {p}" in tail[0] for p in ("fwd ", "bwd ", "fwd+bwd"))
    assert any(line.startswith("cases by verdict") and "speedup vs naive: naive's median latency / the backend's"
               in line for line in tail)
    assert len(tail[1].split()) == 1 + 6 + 1 + 3  # backend, the six verdict counts, rejected, three speedups
    assert tail[-2].startswith("results: ") and tail[-1].startswith("=") and " passed" in tail[-1]
    assert "Name (time in ms)" not in res.stdout and "(1.0)" not in res.stdout  # pytest-benchmark's table is off


def test_pytest_benchmarks_table_shows_only_when_its_options_are_given():
    from types import SimpleNamespace

    from harness.suite.plugin import _quiet_benchmark_table

    for args, quiet in ((["suites", "--benchmark"], True), (["suites", "--benchmark", "--benchmark-verbose"], False),
                        (["suites", "--benchmark", "--benchmark-columns=median"], False)):
        config = SimpleNamespace(option=SimpleNamespace(benchmark_quiet=False),
                                 invocation_params=SimpleNamespace(args=tuple(args)))
        _quiet_benchmark_table(config)
        assert config.option.benchmark_quiet is quiet, args


def test_gamed_plugins_lose_their_figures_and_honest_ones_keep_theirs(tmp_path):
    """docs/integrity.md: a kernel that caches its no-grad answers and one that memoises its gradients per graph
    pass correctness where they compute, and every timing of theirs is rejected, with no figure in the results."""
    res = run_suites(tmp_path, "--matrix", "smoke", "--benchmark", "--rounds", "1", "--timing-budget-ms", "20",
                     "--backend-module", "tests/fixtures/gamed_plugin.py",
                     "--backends", "naive,gamed-cached-no-grad,gamed-memo-per-graph")
    run_dir = the_run(tmp_path)
    df = load_results(run_dir)
    cheats = {("gamed-cached-no-grad", "fwd"), ("gamed-memo-per-graph", "bwd")}
    cheating = pd.Series([(b, p) in cheats for b, p in zip(df.backend, df.phase)], index=df.index)
    judged = df[cheating & (df.status == "pass")]
    assert len(judged) > 0, res.stdout[-3000:]
    assert set(judged.timing_status) == {"rejected"} and judged.latency_ms.isna().all(), judged.timing_reason
    naive = df[df.backend == "naive"]
    assert set(naive.timing_status) == {"timed"} and naive.latency_ms.notna().all()
    assert "rejected" in res.stdout and res.returncode == 1
