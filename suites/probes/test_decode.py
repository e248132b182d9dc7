"""KV cache per backend: the last query over its cache equals the last row of full causal attention, and a
chunked prefill (queries in pieces over the growing cache) equals one full pass, forward and backward."""

from __future__ import annotations

from harness.cases.case import AttentionCase
from harness.probes.kvcache import decode_rows, prefill_rows
from harness.cases.masks import Causal
from harness.suite.outcome import conclude
from harness.suite.probes import parametrize, tier


def kv_cases(level: str) -> list[tuple[AttentionCase, int]]:
    """(square causal case, prefill chunks); GQA in the default, MQA/GQA/MHA and more dtypes in full."""
    cases = [(AttentionCase(2, 4, 48, 64, "fp32", kv_heads=2, mask=Causal()), 2)]
    if level == "full":
        cases += [(AttentionCase(2, 8, n, 64, dt, kv_heads=kv, mask=Causal()), chunks)
                  for dt in ("fp16", "bf16") for kv in (1, 2, 8) for n, chunks in ((129, 3), (257, 5))]
    return cases


def pytest_generate_tests(metafunc):
    config = metafunc.config
    level = tier(config) or "default"
    if "kv_case" in metafunc.fixturenames:
        pairs = [(c, n, b) for c, n in kv_cases(level) for b in config._harness_backends]
        if metafunc.function.__name__ == "test_chunked_prefill" and level == "default":
            # each chunk is a new shape, i.e. a new compile: chunked prefill of those backends runs in full
            pairs = [(c, n, b) for c, n, b in pairs if not b.compiles_per_shape]
        parametrize(metafunc, ("kv_case", "chunks", "backend"), pairs,
                    [f"{b.name}-{c.id}-{n}chunks" for c, n, b in pairs])


def test_decode_step(kv_case, chunks, backend, run_session, write_probe):
    rows = decode_rows(backend, kv_case, run_session.device, seed=run_session.seed, run_id=run_session.run_id,
                       executor=run_session.executor)
    write_probe(rows)
    conclude(rows)


def test_chunked_prefill(kv_case, chunks, backend, run_session, write_probe):
    rows = prefill_rows(backend, kv_case, chunks, run_session.device, seed=run_session.seed,
                        run_id=run_session.run_id, executor=run_session.executor)
    write_probe(rows)
    conclude(rows)
