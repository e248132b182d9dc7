"""The float64 reference at seq 32768 stays within 2 GiB (query-block chunking); runs with --matrix full."""

from __future__ import annotations

import time

import pytest
import torch

from harness import AttentionCase, make_inputs, reference_attention
from harness.measure.memory import peak_memory
from harness.store.rows import make_row
from harness.store.schema import FWD_BWD, OBSERVED

LIMIT_BYTES = 2 * 2 ** 30


def test_reference_long_sequence_memory(request, run_session):
    if request.config.getoption("matrix") != "full":
        pytest.skip("long-sequence reference check runs with --matrix full (about a minute on 2 CPU cores)")
    case = AttentionCase(1, 1, 32768, 128, "fp64")
    inputs = make_inputs(case, "cpu")
    start = time.perf_counter()
    cpu = torch.device("cpu")
    peak, method = peak_memory(lambda: reference_attention(case, inputs), device=cpu)
    seconds = time.perf_counter() - start
    run_session.writer.write([make_row(
        run_id=run_session.run_id, case=case, backend="reference", backend_version=torch.__version__,
        phase=FWD_BWD, device=cpu, status=OBSERVED, tag="reference-scale",
        observed=f"peak {peak / 2 ** 30:.2f} GiB above inputs in {seconds:.0f} s", peak_mem_bytes=peak,
        mem_method=method, latency_ms=seconds * 1e3)])
    assert peak <= LIMIT_BYTES, f"reference used {peak / 2 ** 30:.2f} GiB > 2 GiB at seq 32768"
