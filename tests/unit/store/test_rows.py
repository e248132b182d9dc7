"""harness.store.rows.make_row: the one row builder - the case's columns, the checks' columns, provenance, the tag,
and the schema's validation of what it is given."""

import math
from datetime import datetime

import pytest
import torch

from harness.oracle.verdict import Check
from harness.cases.case import AttentionCase
from harness.cases.masks import Causal
from harness.store import host
from harness.store.rows import make_row
from harness.store.schema import FAIL, FWD, PASS

CPU = torch.device("cpu")
CASE = AttentionCase(2, 8, 64, 32, "bf16", kv_heads=2, seq_k=96, mask=Causal())


def _row(**kwargs):
    return make_row(**{"run_id": "run1", "case": CASE, "backend": "sdpa", "backend_version": "2.13.0", "phase": FWD,
                       "device": CPU, "status": PASS, **kwargs})


def test_a_row_carries_the_cases_columns_and_where_and_when_it_ran():
    row = _row()
    assert (row.case_id, row.batch, row.heads, row.kv_heads, row.seq_q, row.seq_k, row.head_dim) == (
        CASE.id, 2, 8, 2, 64, 96, 32)
    assert (row.dtype, row.mask, row.modifiers, row.scale, row.device) == ("bf16", CASE.mask_id, CASE.modifier_id,
                                                                            CASE.scale, "cpu")
    assert row.page_size is None and row.head_dim_v == 32  # contiguous K/V; V's head dim is K's
    assert row.testbed_id == host.testbed_id(CPU) and row.torch_version == torch.__version__
    assert datetime.fromisoformat(row.timestamp).utcoffset().total_seconds() == 0  # UTC, seconds resolution


def test_each_check_gives_its_err_tol_and_naive_err_and_the_row_its_worst_ratio():
    checks = [Check("out", 0.01, 0.04, 0.02, False), Check("dq", 0.03, 0.04, None, False)]
    row = _row(checks=checks)
    assert (row.out_err, row.out_tol, row.naive_out_err) == (0.01, 0.04, 0.02)
    assert (row.dq_err, row.dq_tol, row.naive_dq_err) == (0.03, 0.04, None)  # no baseline: the cell stays empty
    assert row.err_ratio == pytest.approx(0.75) and row.nonfinite is False
    bad = _row(status=FAIL, checks=[Check("out", math.nan, 0.04, 0.02, True)])
    assert bad.nonfinite is True and bad.err_ratio == math.inf
    assert _row().err_ratio is None and _row().nonfinite is None  # nothing judged: no verdict columns


def test_a_tag_keeps_a_probes_rows_apart_and_columns_set_any_other_field():
    row = _row(tag="semantics:scale", observed="honoured", backend_op="sdpa:math", batch=0)
    assert row.case_id == f"semantics:scale:{CASE.id}"
    assert (row.observed, row.backend_op, row.batch) == ("honoured", "sdpa:math", 0)  # a column overrides the case's


def test_a_status_or_phase_outside_the_schema_is_refused_in_one_line():
    with pytest.raises(ValueError, match="status='passed'; allowed: pass, fail"):
        _row(status="passed")
    with pytest.raises(ValueError, match=r"phase='forward'; allowed: fwd, bwd, fwd\+bwd"):
        _row(phase="forward")
    with pytest.raises(TypeError):
        _row(latency=1.0)  # not a column
