"""Helpers shared by the probe suites (semantics, edge cases, KV cache, documents, dropout, determinism)."""

from __future__ import annotations

import pytest

from harness.launch.sharding import parse_shard
from harness.store.schema import ERROR, FAIL, OBSERVED, PASS, Row


def tier(config) -> str | None:
    """'default' or 'full' when these suites run in this session; None when they do not (a smoke matrix, or a
    shard other than 0: they have no cases to shard, so shard 0 alone runs them)."""
    matrix = config._harness_matrix
    if matrix in ("smoke", "gpu-smoke"):
        return None
    if config.option.shard and parse_shard(config.option.shard)[0] != 0:
        return None
    return "full" if matrix in ("full", "gpu-full") else "default"


def parametrize(metafunc, names: tuple[str, ...], values: list[tuple], ids: list[str]) -> None:
    """Parametrize `names`; when these suites are off, one skipped placeholder that says why."""
    if tier(metafunc.config) is None:
        why = ("semantics and edge-case suites run in the default and full matrices (not smoke), in shard 0 only")
        metafunc.parametrize(names, [pytest.param(*[None] * len(names), marks=pytest.mark.skip(reason=why))],
                             ids=["off"])
        return
    metafunc.parametrize(names, values, ids=ids)


def conclude(rows: list[Row], known_failure: str | None = None) -> None:
    """Turn written rows into the test outcome: fail/error fails, nothing judged skips with the reasons.

    `known_failure` is a documented limitation (e.g. naive attention overflowing fp16 by design): the test
    then must fail, and is reported as xfail; if it passes, the claim is stale and the test fails.
    """
    statuses = {r.status for r in rows}
    bad = [f"{r.phase}: {r.status}: {r.reason}" for r in rows if r.status in (FAIL, ERROR)]
    if known_failure is not None:
        if bad:
            pytest.xfail(f"known limitation: {known_failure} ({'; '.join(bad)[:300]})")
        pytest.fail(f"expected to fail (known limitation: {known_failure}) but did not", pytrace=False)
    if bad:
        pytest.fail("; ".join(bad), pytrace=False)
    if not statuses & {PASS, OBSERVED}:
        reasons = sorted({f"{r.status}: {r.reason}" for r in rows})
        pytest.skip("; ".join(reasons)[:500])
