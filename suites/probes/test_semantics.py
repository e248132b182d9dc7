"""Semantics questions per backend (fully-masked rows, causal alignment, decode causal, finite mask values,
bool vs additive masks, scale, NaN in masked K/V): each answer is an 'observed' row; refusing is an answer."""

from __future__ import annotations

from harness.probes.semantics import QUESTIONS, ask, describe
from harness.suite.outcome import conclude
from harness.suite.probes import parametrize


def pytest_generate_tests(metafunc):
    if "question" in metafunc.fixturenames:
        # backend-major: the probe runs one backend shares between its questions stay cached
        pairs = [(b, q) for b in metafunc.config._harness_backends for q in QUESTIONS]
        parametrize(metafunc, ("backend", "question"), pairs, [f"{b.name}-{q}" for b, q in pairs])


def test_semantics(backend, question, run_session, write_probe):
    row = ask(question, backend, run_session.device, seed=run_session.seed, run_id=run_session.run_id,
              executor=run_session.executor, cache=run_session.cache.probe_runs)
    write_probe([row])
    print(describe(row))
    conclude([row])
