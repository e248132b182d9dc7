"""Deterministic sharding of a case list: shard i of n takes every n-th case, so shards partition the cases."""

from __future__ import annotations

import re
from typing import Sequence, TypeVar

T = TypeVar("T")


def parse_shard(spec: str) -> tuple[int, int]:
    """'i/n' with 0 <= i < n -> (i, n); anything else is a ValueError naming the value."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", spec or "")
    if not match or int(match[2]) < 1 or int(match[1]) >= int(match[2]):
        raise ValueError(f"--shard {spec!r}: expected i/n with 0 <= i < n, e.g. 0/4")
    return int(match[1]), int(match[2])


def select_shard(items: Sequence[T], index: int, count: int) -> list[T]:
    """Round-robin over the stable order of `items`: balanced, and the union of all shards is exactly `items`."""
    return list(items[index::count])
