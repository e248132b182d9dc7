"""Forward output and dq/dk/dv of every backend against the float64 reference, on every case of the matrix."""

from __future__ import annotations

from harness.suite.outcome import conclude


def test_correctness(case, backend, run_session):
    conclude(run_session.check(case, backend).rows)
