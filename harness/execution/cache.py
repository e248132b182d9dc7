"""The one way the harness keeps inputs and prepared cases around: small LRUs owned by a run (or a worker), each
bounded below with its reason, so nothing cached outlives the run that made it."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Hashable, TypeVar

T = TypeVar("T")

#: prepared cases (seeded inputs, float64 reference, naive errors) of a run: every stage walks its cases one at a
#: time, each case through every backend before the next (case-major), so the current case and the one before
#: are enough - and a large case's reference is large. The correctness matrix, the docs and the edge cases share it.
PREPARED_CASES = 2
#: a case's seeded inputs alone, to time a verified backend whose prepared case is no longer held
TIMING_INPUTS = 2
#: the semantics probes' runs (tiny tensors), shared by the several questions asked of one backend in a row
PROBE_RUNS = 8
#: inputs a process (a worker, or the in-process executor) drew from a seed: the correctness call and the timing
#: rounds of one case share them; one case at a time, since the inputs of a large case are large
DRAWN_INPUTS = 1


class LRU:
    """Holds at most `size` values; `get(key, make)` computes a missing value once and keeps the newest ones."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"LRU size={size!r}: must be >= 1")
        self.size = size
        self._items: OrderedDict = OrderedDict()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

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


def cached(cache: LRU | None, key: Hashable, make: Callable[[], T]) -> T:
    """`make()` kept in `cache` under `key`; computed afresh when there is no cache (a probe run on its own)."""
    return make() if cache is None else cache.get(key, make)


@dataclass
class RunCaches:
    """Every cache of one run, each bounded (see the sizes above), dropped with the run's session."""

    prepared: LRU = field(default_factory=lambda: LRU(PREPARED_CASES))
    timing_inputs: LRU = field(default_factory=lambda: LRU(TIMING_INPUTS))
    probe_runs: LRU = field(default_factory=lambda: LRU(PROBE_RUNS))

    def clear(self) -> None:
        for cache in (self.prepared, self.timing_inputs, self.probe_runs):
            cache.clear()
