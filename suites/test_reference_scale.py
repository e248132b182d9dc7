"""The float64 reference at seq 32768 stays within 2 GiB (query-block chunking); runs with --matrix full."""

from __future__ import annotations

import time

import pytest
import torch

from harness import AttentionCase, make_inputs, reference_attention
from harness.memory import peak_memory
from harness.runner import case_columns

LIMIT_BYTES = 2 * 2 ** 30


def test_reference_long_sequence_memory(request, run_session):
    if request.config.getoption("matrix") != "full":
        pytest.skip("long-sequence reference check runs with --matrix full (about a minute on 2 CPU cores)")
    case = AttentionCase(1, 1, 32768, 128, "fp64")
    inputs = make_inputs(case, "cpu")
    start = time.perf_counter()
    peak, method = peak_memory(lambda: reference_attention(case, inputs), device=torch.device("cpu"))
    seconds = time.perf_counter() - start
    run_session.writer.write([{
        "run_id": run_session.run_id, "backend": "reference", "phase": "fwd+bwd",
        **case_columns(case, run_session.device) | {"case_id": f"reference-scale:{case.id}", "device": "cpu"},
        "status": "observed", "observed": f"peak {peak / 2 ** 30:.2f} GiB above inputs in {seconds:.0f} s",
        "peak_mem_bytes": peak, "mem_method": method, "latency_ms": seconds * 1e3,
    }])
    assert peak <= LIMIT_BYTES, f"reference used {peak / 2 ** 30:.2f} GiB > 2 GiB at seq 32768"
