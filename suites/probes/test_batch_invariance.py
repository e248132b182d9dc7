"""Batch invariance per backend: one sequence alone vs co-batched with sequences of other lengths (prefill, decode,
paged decode), recorded next to the determinism probe."""

from __future__ import annotations

from harness.probes.batch_invariance import KINDS, check_batch_invariance
from harness.suite.outcome import conclude
from harness.suite.probes import parametrize, tier


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames and "kind" in metafunc.fixturenames:
        level = tier(metafunc.config) or "default"
        pairs = [(b, k) for b in metafunc.config._harness_backends for k in KINDS
                 # each kind is two new shapes, two compiles (the paged decode ~9 s each on the CPU), for an
                 # observation, not a verdict: such backends are observed in the full tier
                 if level == "full" or not b.compiles_per_shape]
        parametrize(metafunc, ("backend", "kind"), pairs, [f"{b.name}-{k}" for b, k in pairs])


def test_batch_invariance(backend, kind, run_session, write_probe):
    row = check_batch_invariance(backend, kind, run_session.device, seed=run_session.seed,
                                 run_id=run_session.run_id, executor=run_session.executor)
    write_probe([row])
    conclude([row])
