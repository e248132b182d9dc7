"""Edge cases that must be correct (off-tile sizes, head dims, GQA, strided/expanded/NaN-padded inputs,
large magnitudes, fp16 near overflow, cross-attention with padding, empty tensors), judged like any case."""

from __future__ import annotations

import pytest

from harness.probes import edge_cases as edge_probe, empty
from harness.probes.edge_cases import edge_cases, run_edge
from harness.probes.empty import SHAPES, empty_row, probe_all
from harness.suite.outcome import conclude
from harness.suite.probes import parametrize, tier


def pytest_generate_tests(metafunc):
    config = metafunc.config
    level = tier(config) or "default"
    backends = config._harness_backends
    if "edge" in metafunc.fixturenames:
        pairs = [(e, b) for e in edge_cases(level) for b in backends
                 if level == "full" or e.compiled_default or not b.compiles_per_shape]
        parametrize(metafunc, ("edge", "backend"), pairs, [f"{b.name}-{e.id}" for e, b in pairs])
    if "empty_shape" in metafunc.fixturenames:
        pairs = [(s, b) for b in backends for s in SHAPES]
        parametrize(metafunc, ("empty_shape", "backend"), pairs, [f"{b.name}-{s}" for s, b in pairs])


def test_edge_case(edge, backend, run_session, write_probe):
    rows = run_edge(edge, backend, run_session.device, seed=run_session.seed, run_id=run_session.run_id,
                    executor=run_session.executor, cache=run_session.cache.prepared)
    write_probe(rows)
    conclude(rows, backend.known_failure(edge_probe.PROBE, edge.name, run_session.device.type))


@pytest.fixture(scope="module")
def empty_outcomes(request, run_session):
    """Every (backend, empty shape) probed once, in worker processes even with --no-isolate (a crash must not
    end the run)."""
    return probe_all(request.config._harness_backends, run_session.device, run_session.crash_safe_executor())


def test_empty_tensors(empty_shape, backend, run_session, empty_outcomes, write_probe):
    device = run_session.device
    row = empty_row(backend, empty_shape, empty_outcomes[(backend.name, empty_shape)], device, run_session.run_id)
    write_probe([row])
    conclude([row], backend.known_failure(empty.PROBE, empty_shape, device.type))
