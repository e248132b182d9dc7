"""A small least-recently-used cache: the one way the harness keeps a few prepared cases or probe runs around."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable, TypeVar

T = TypeVar("T")


class LRU:
    """Holds at most `size` values; `get(key, make)` computes a missing value once and keeps the newest ones."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"LRU size={size!r}: must be >= 1")
        self.size = size
        self._items: OrderedDict = OrderedDict()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def get(self, key: Hashable, make: Callable[[], T] | None = None) -> T:
        if key not in self._items:
            if make is None:
                raise KeyError(key)
            self._items[key] = make()
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        self._items.move_to_end(key)
        return self._items[key]

    def clear(self) -> None:
        self._items.clear()
