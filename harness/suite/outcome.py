"""The one way written rows become a pytest outcome (pass, fail, skip or xfail) in every suite."""

from __future__ import annotations

import pytest

from harness.store.schema import FAILING, OBSERVED, OOM, PASS, Row


def conclude(rows: list[Row], known_failure: str | None = None) -> None:
    """Rows to the test outcome: fail/error fails, oom or nothing judged skips, else passes; `known_failure`: xfail."""
    statuses = {r.status for r in rows}
    bad = [f"{r.phase}: {r.status}: {r.reason}" for r in rows if r.status in FAILING]
    if known_failure is not None:
        if bad:
            pytest.xfail(f"known limitation: {known_failure} ({'; '.join(bad)[:300]})")
        pytest.fail(f"expected to fail (known limitation: {known_failure}) but did not", pytrace=False)
    if bad:
        pytest.fail("; ".join(bad), pytrace=False)
    if OOM in statuses or not statuses & {PASS, OBSERVED}:
        reasons = sorted({f"{r.status}: {r.reason}" for r in rows if r.status not in (PASS, OBSERVED)})
        pytest.skip("; ".join(reasons)[:500])
