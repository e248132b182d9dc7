"""Forward output and dq/dk/dv of every backend against the float64 reference, on every case of the matrix."""

from __future__ import annotations

import pytest

from harness.execution.runner import execute


def test_correctness(case, backend, run_session):
    result = execute(backend, run_session.prepared(case), run_session.run_id)
    run_session.record(case, backend, result)
    status = result.status
    if status in ("unavailable", "unsupported", "oom"):
        pytest.skip(f"{status}: {result.reasons}")
    if status != "pass":
        pytest.fail(f"{status}: {result.reasons}", pytrace=False)
