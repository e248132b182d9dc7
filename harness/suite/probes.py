"""Helpers shared by the probe suites (semantics, edge cases, KV cache, documents, dropout, determinism)."""

from __future__ import annotations

import pytest

from harness.launch.sharding import parse_shard


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

