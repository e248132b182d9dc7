"""The same-dtype naive baseline: chunked by query rows when dense would not fit, and recorded on the row."""

import pytest
import torch

from harness.run.runner import prepare_case
from harness.oracle.baseline import baseline, chunk_rows, dense_bytes
from harness.oracle.reference import reference_attention
from harness.cases.case import AttentionCase, make_inputs
from harness.cases.masks import Causal, Documents, KeyPadding, SlidingWindow

MASKS = [None, Causal(), SlidingWindow(5), KeyPadding((37, 20)), Documents((10, 20, 7))]


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "none" if m is None else m.id)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_chunked_baseline_matches_dense(mask, dtype):
    case = AttentionCase(2, 4, 37, 16, dtype, kv_heads=2, mask=mask)
    inputs = make_inputs(case, "cpu", seed=3)
    ref = reference_attention(case, inputs)
    dense = baseline(case, inputs, ref, budget_bytes=dense_bytes(case))
    rows = chunk_rows(case, dense_bytes(case) // 5)
    chunked = baseline(case, inputs, ref, budget_bytes=dense_bytes(case) // 5)
    assert dense.method == "dense" and chunked.method == f"chunked ({rows} query rows a chunk)" and rows < 37
    # each query row is computed on its own either way: the forward error, and dQ's, are the dense ones exactly
    assert chunked.checks["out"].err == dense.checks["out"].err
    assert chunked.checks["dq"].err == dense.checks["dq"].err
    # dK/dV sum over chunks (in float32): within the same rounding model, and the baseline stays usable
    for name in ("dk", "dv"):
        assert chunked.checks[name].err <= 2 * dense.checks[name].err + 1e-6 * ref.get(name).abs().max()
    assert dense.usable and chunked.usable


def test_the_row_records_which_baseline_ran():
    case = AttentionCase(1, 2, 64, 16, "fp32", mask=Causal())
    dense = prepare_case(case, torch.device("cpu"))
    small = prepare_case(case, torch.device("cpu"), budget_bytes=dense_bytes(case) // 8)
    assert dense.baseline == "dense" and small.baseline.startswith("chunked (")
    assert small.naive_errors["out"] == dense.naive_errors["out"]


def test_reference_is_kept_on_the_cpu_for_judging():
    prepared = prepare_case(AttentionCase(1, 2, 8, 16, "fp32"), torch.device("cpu"))
    assert all(t.device.type == "cpu" and t.dtype == torch.float64 for t in prepared.reference.tensors() if t is not None)
