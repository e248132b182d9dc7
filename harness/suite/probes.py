"""Helpers shared by the probe suites (semantics, edge cases, KV cache, documents, dropout, determinism)."""

from __future__ import annotations

import pytest

from harness.launch.sharding import parse_shard
from harness.cases.matrices import FUZZ, REGISTRY


def tier(config) -> str | None:
    """The probes' tier, 'default' or 'full'; None when they do not run here (smoke, or a shard other than 0)."""
    # a model preset's cases ("model NAME") are the main job's size: the default tier; fuzzed cases run no probes
    name = config._harness_matrix
    runtime = REGISTRY[name].runtime if name in REGISTRY else "smoke" if name == FUZZ else "default"
    if runtime == "smoke" or config.option.shard and parse_shard(config.option.shard)[0] != 0:
        return None
    return runtime


def parametrize(metafunc, names: tuple[str, ...], values: list[tuple], ids: list[str]) -> None:
    """Parametrize `names`; when these suites are off, one skipped placeholder that says why."""
    if tier(metafunc.config) is None:
        why = ("semantics and edge-case suites run in the default and full matrices (not smoke), in shard 0 only")
        metafunc.parametrize(names, [pytest.param(*[None] * len(names), marks=pytest.mark.skip(reason=why))],
                             ids=["off"])
        return
    metafunc.parametrize(names, values, ids=ids)

