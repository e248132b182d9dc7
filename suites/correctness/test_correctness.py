"""Forward output and dq/dk/dv of every backend against the float64 reference, on every case of the matrix."""

from __future__ import annotations

import pytest
from harness.store.schema import OOM, PASS, UNAVAILABLE, UNSUPPORTED



def test_correctness(case, backend, run_session):
    result = run_session.check(case, backend)
    status = result.status
    if status in (UNAVAILABLE, UNSUPPORTED, OOM):
        pytest.skip(f"{status}: {result.reasons}")
    if status != PASS:
        pytest.fail(f"{status}: {result.reasons}", pytrace=False)
