"""pytest options and parametrization for the attention suites: one test per (backend, case)."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest

from harness.backends.base import get_backends, load_backend_module
from harness.env import resolve_device
from harness.matrices import MATRICES, build_matrix
from harness.results import compact
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
    if getattr(config, "workerinput", None) is None and not config.option.collectonly:
        config.stash[_SESSION_KEY] = RunSession(device, Path(config.option.results_dir), config.option.seed)
    config._harness_device = device


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames and "backend" in metafunc.fixturenames:
        config = metafunc.config
        # case-major order: the reference of a case is computed once and reused by every backend
        pairs = [(c, b) for c in config._harness_cases for b in config._harness_backends]
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
    counts: dict[str, Counter] = defaultdict(Counter)
    for (_, backend), result in session.verdicts.items():
        counts[backend][result.status] += 1
    statuses = ["pass", "fail", "error", "oom", "unsupported", "unavailable"]
    tr = terminalreporter
    tr.section("attention harness")
    tr.write_line(f"{'backend':<16}" + "".join(f"{s:>13}" for s in statuses))
    for backend, c in counts.items():
        tr.write_line(f"{backend:<16}" + "".join(f"{c.get(s, 0):>13}" for s in statuses))
    compact(session.writer.path)
    tr.write_line(f"results: {session.writer.path}")
