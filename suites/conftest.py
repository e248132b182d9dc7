"""pytest options and parametrization for the attention suites: one test per (backend, case)."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch

from harness.backends.base import get_backends, load_backend_module
from harness.env import resolve_device
from harness.matrices import MATRICES, build_matrix
from harness.perf import PHASES
from harness.timing import TimingConfig
from harness.session import RunSession
from harness.sharding import parse_shard, select_shard

_SESSION_KEY = pytest.StashKey[RunSession]()


def pytest_addoption(parser):
    group = parser.getgroup("attention harness")
    group.addoption("--backends", default="all", help="comma-separated backend names, or 'all' (default: all)")
    group.addoption("--backend-module", action="append", default=[],
                    help="module name or .py path registering extra backends (repeatable)")
    group.addoption("--matrix", default="default", help=f"case matrix: {', '.join(MATRICES)} (default: default)")
    group.addoption("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    group.addoption("--results-dir", default="results", help="where run directories go (default: results)")
    group.addoption("--seed", type=int, default=0, help="input seed (default: 0)")
    group.addoption("--benchmark", action="store_true", dest="benchmark_enabled",
                    help="also measure latency, peak memory and FLOP/s of every correct (case, backend, phase)")
    group.addoption("--timing-budget-ms", type=float, default=100.0,
                    help="time budget per timed key in ms, split over --rounds; repetitions = budget / estimated "
                         "latency (default: 100)")
    group.addoption("--rounds", type=int, default=3,
                    help="measurement rounds per timed (case, backend, phase), spread over the run, each with "
                         "1/rounds of the budget; compare needs >= 2 to tell a transient from a regression "
                         "(default: 3)")
    group.addoption("--cuda-graph", action="store_true", help="GPU: time forward replays of a captured CUDA graph")
    group.addoption("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice); recorded")
    group.addoption("--cpu-mem-budget-gb", type=float, default=None,
                    help="CPU: record a case as oom when its measured peak memory exceeds this many GiB")
    group.addoption("--no-report", action="store_false", dest="report",
                    help="skip the figures and report/report.html at the end of the run")
    group.addoption("--shard", default=None, help="run only shard i of n of the cases, as 'i/n' (default: all)")


def pytest_configure(config):
    if not hasattr(config.option, "matrix"):
        return
    try:
        for module in config.option.backend_module:
            load_backend_module(module)
        config._harness_backends = get_backends(config.option.backends)
        config._harness_cases = build_matrix(config.option.matrix)
        if config.option.shard:
            config._harness_cases = select_shard(config._harness_cases, *parse_shard(config.option.shard))
        device = resolve_device(config.option.device)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if config.option.rounds < 1:
        raise pytest.UsageError(f"--rounds {config.option.rounds}: must be >= 1")
    if config.option.threads is not None:
        if config.option.threads < 1:
            raise pytest.UsageError(f"--threads {config.option.threads}: must be >= 1")
        torch.set_num_threads(config.option.threads)  # fixed for the whole run, recorded in env and rows
    if getattr(config, "workerinput", None) is None and not config.option.collectonly:
        budget = config.option.cpu_mem_budget_gb
        session = RunSession(device, Path(config.option.results_dir), config.option.seed,
                             timing=TimingConfig(warmup_ms=config.option.timing_budget_ms / 4,
                                                 budget_ms=config.option.timing_budget_ms,
                                                 cuda_graph=config.option.cuda_graph),
                             cpu_mem_budget=None if budget is None else int(budget * 2 ** 30),
                             rounds=config.option.rounds)
        if config.option.benchmark_enabled:
            session.measure_peaks(sorted({c.dtype for c in config._harness_cases}, key=str))
        config.stash[_SESSION_KEY] = session
        if config.getoption("benchmark_storage", None) == "file://./.benchmarks":
            # pytest-benchmark's own --benchmark-compare must only compare like with like: one store per testbed
            config.option.benchmark_storage = f"file://./.benchmarks/{session.env['testbed_id']}"
    config._harness_device = device


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames and "backend" in metafunc.fixturenames:
        config = metafunc.config
        # case-major order: the reference of a case is computed once and reused by every backend
        pairs = [(c, b) for c in config._harness_cases for b in config._harness_backends]
        if "phase" in metafunc.fixturenames and "perf_round" in metafunc.fixturenames:
            # round-major: every key's first round, then every key's second... so the rounds of one key are
            # minutes apart and a transient (another process, a clock dip) hits at most one of them
            rounds = config.option.rounds
            quads = [(c, b, p, r) for r in range(rounds) for c, b in pairs for p in PHASES]
            metafunc.parametrize(("case", "backend", "phase", "perf_round"), quads,
                                 # the last round keeps the plain id: it is the one pytest-benchmark records, so
                                 # its stored names do not depend on --rounds
                                 ids=[f"{b.name}-{c.id}-{p}" + (f"-round{r + 1}of{rounds}" if r < rounds - 1 else "")
                                      for c, b, p, r in quads])
        elif "phase" in metafunc.fixturenames:
            triples = [(c, b, p) for c, b in pairs for p in PHASES]
            metafunc.parametrize(("case", "backend", "phase"), triples,
                                 ids=[f"{b.name}-{c.id}-{p}" for c, b, p in triples])
        else:
            metafunc.parametrize(("case", "backend"), pairs, ids=[f"{b.name}-{c.id}" for c, b in pairs])


@pytest.fixture(scope="session")
def run_session(request) -> RunSession:
    session = request.config.stash.get(_SESSION_KEY, None)
    if session is None:
        pytest.skip("no run session (collect-only or xdist worker)")
    return session


def pytest_terminal_summary(terminalreporter, config):
    session = config.stash.get(_SESSION_KEY, None)
    if session is None or not session.verdicts:
        return
    tr = terminalreporter
    tr.section("attention harness")
    for line in summary_lines(session):
        tr.write_line(line)
    session.finish()
    tr.write_line(f"results: {session.writer.path}")
    if config.getoption("report", True):
        try:  # figures and report are built from the stored files only; a drawing problem must not fail the run
            from harness.report import build_report
            tr.write_line(f"report:  {build_report(session.run_dir)}")
        except Exception as exc:
            tr.write_line(f"report:  not built ({type(exc).__name__}: {exc}); retry with "
                          f"python -m harness report {session.run_dir}")


def summary_lines(session: RunSession) -> list[str]:
    """Per backend: cases by correctness status and, when timed, the median speedup over naive per phase."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for (_, backend), result in session.verdicts.items():
        counts[backend][result.status] += 1
    speedups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (case_id, backend, phase), row in session.perf_rows.items():
        naive = session.perf_rows.get((case_id, "naive", phase), {})
        if row.get("latency_ms") and naive.get("latency_ms"):
            speedups[backend][phase].append(naive["latency_ms"] / row["latency_ms"])
    statuses = ["pass", "fail", "error", "oom", "unsupported", "unavailable"]
    header = f"{'backend':<16}" + "".join(f"{s:>12}" for s in statuses)
    if session.perf_rows:
        header += "".join(f"{'x naive ' + p:>18}" for p in PHASES)
    lines = [header]
    for backend, c in counts.items():
        line = f"{backend:<16}" + "".join(f"{c.get(s, 0):>12}" for s in statuses)
        if session.perf_rows:
            line += "".join(f"{_median(speedups[backend][p]):>18}" for p in PHASES)
        lines.append(line)
    return lines


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"
