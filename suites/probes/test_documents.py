"""Packed documents (block-diagonal masks, causal or not, zero-length and length-1 documents) per backend,
through each backend's own translation (dense mask, FA2 varlen, xformers BlockDiagonal, flex mask_mod)."""

from __future__ import annotations

from harness.cases.case import AttentionCase
from harness.cases.masks import Documents
from harness.run.runner import execute
from harness.suite.outcome import conclude
from harness.suite.probes import parametrize, tier


def doc_cases(level: str) -> list[tuple[AttentionCase, bool]]:
    """(case, also run for compile-per-shape backends in the default matrix)."""
    cases = [
        (AttentionCase(2, 4, 32, 64, "fp32", mask=Documents((5, 0, 1, 17, 9), causal=True)), True),
        (AttentionCase(2, 4, 32, 64, "bf16", mask=Documents((7, 0, 1, 24))), False),
        # cross-attention documents: doc 1 has queries but no keys (empty rows), doc 2 keys but no queries
        (AttentionCase(2, 4, 6, 64, "fp32", seq_k=10, mask=Documents((3, 2, 0, 1), (5, 0, 4, 1), causal=True)),
         False),
    ]
    if level == "full":
        cases += [(AttentionCase(2, 8, 300, d, dt, kv_heads=kv, mask=Documents((1, 0, 128, 44, 0, 127), causal=c)),
                   False) for dt in ("fp16", "bf16") for d in (64, 128) for kv in (2, 8) for c in (False, True)]
    return cases


def pytest_generate_tests(metafunc):
    config = metafunc.config
    level = tier(config) or "default"
    if "doc_case" in metafunc.fixturenames:
        pairs = [(c, b) for c, compiled_ok in doc_cases(level) for b in config._harness_backends
                 if level == "full" or compiled_ok or not b.compiles_per_shape]
        parametrize(metafunc, ("doc_case", "backend"), pairs, [f"{b.name}-{c.id}" for c, b in pairs])


def test_documents(doc_case, backend, run_session, write_probe):
    rows = execute(backend, run_session.prepared(doc_case), run_session.run_id, executor=run_session.executor,
                   tag="docs").rows
    write_probe(rows)
    conclude(rows)
