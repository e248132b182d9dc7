"""Dropout (statistics judged, RNG stream recorded) and backward determinism (judged where claimed), per backend."""

from __future__ import annotations

from harness.probes.determinism import check_determinism
from harness.probes.dropout import check_dropout
from harness.suite.outcome import conclude
from harness.suite.probes import parametrize


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames and "case" not in metafunc.fixturenames:
        backends = metafunc.config._harness_backends
        parametrize(metafunc, ("backend",), [(b,) for b in backends], [b.name for b in backends])


def test_dropout(backend, run_session, write_probe):
    rows = check_dropout(backend, run_session.device, seed=run_session.seed, run_id=run_session.run_id,
                         executor=run_session.executor)
    write_probe(rows)
    conclude(rows)


def test_determinism(backend, run_session, write_probe):
    row = check_determinism(backend, run_session.device, seed=run_session.seed, run_id=run_session.run_id,
                            executor=run_session.executor)
    write_probe([row])
    conclude([row])
