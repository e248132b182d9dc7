"""The harness's caches: small LRUs owned by a run (or a worker), each bounded below with its reason."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Hashable, TypeVar

from harness.oracle.placement import reference_bytes

T = TypeVar("T")

#: prepared cases (inputs, float64 reference, naive errors): every stage walks its cases case-major, so the current
#: case and the one before are enough - and a large case's reference is large
PREPARED_CASES = 2
#: the verified answers timing judges against, by size: the benchmark walks every case again once a round, so a run
#: keeps as many as fit (the CPU default matrix's all do) and computes a dropped one again (GPU: seconds in FP64)
ANSWER_BYTES = 2 * 2 ** 30
#: the semantics probes' runs (tiny tensors), shared by the several questions asked of one backend in a row
PROBE_RUNS = 8
#: inputs a process drew from a seed, shared by a case's correctness call and timing rounds; one case at a time
DRAWN_INPUTS = 1
#: the timed contents' standard normal pools a process keeps (calls.content.Contents), by weight: a pool depends on
#: its input's name and size alone, so each is drawn once a process, not once a round (the main job's rounds drew
#: ~2.4 s of pools in the run's process, as much again in the workers); the CPU main job's all fit
POOL_BYTES = 256 * 2 ** 20


class LRU:
    """At most `size` values (with `weigh`, at most `max_bytes` by weight, the newest always); `get(key, make)`."""

    def __init__(self, size: int, weigh: Callable[[object], int] | None = None, max_bytes: int | None = None):
        self.size, self.weigh, self.max_bytes = size, weigh, max_bytes
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
            while len(self._items) > self.size or (len(self._items) > 1 and self._over_weight()):
                self._items.popitem(last=False)
        self._items.move_to_end(key)
        return self._items[key]

    def _over_weight(self) -> bool:
        return (self.weigh is not None and self.max_bytes is not None
                and sum(map(self.weigh, self._items.values())) > self.max_bytes)

    def clear(self) -> None:
        self._items.clear()


def tensor_bytes(t) -> int:
    """A tensor's elements, in bytes."""
    return t.numel() * t.element_size()


def answer_bytes(prepared) -> int:
    """A prepared case's reference, in bytes (as placement weighs it)."""
    return reference_bytes(prepared.reference.tensors())


def pool_cache() -> LRU:
    """The timed contents' pools one process keeps (a worker's, the run's), POOL_BYTES of them."""
    return LRU(1 << 10, tensor_bytes, POOL_BYTES)


def cached(cache: LRU | None, key: Hashable, make: Callable[[], T]) -> T:
    """`make()` kept in `cache` under `key`; computed afresh when there is no cache."""
    return make() if cache is None else cache.get(key, make)


@dataclass
class CallCaches:
    """What a process running backend calls keeps: the inputs it drew last (a case's call and timing rounds)."""

    drawn: LRU = field(default_factory=lambda: LRU(DRAWN_INPUTS))
    pools: LRU = field(default_factory=pool_cache)


@dataclass
class RunCaches:
    """Every cache of one run, dropped with its session."""

    prepared: LRU = field(default_factory=lambda: LRU(PREPARED_CASES))
    answers: LRU = field(default_factory=lambda: LRU(1 << 20, answer_bytes, ANSWER_BYTES))
    probe_runs: LRU = field(default_factory=lambda: LRU(PROBE_RUNS))
    #: the timed contents' pools the run makes again to judge a timed call (run/judge.py)
    pools: LRU = field(default_factory=pool_cache)

    def clear(self) -> None:
        for cache in (self.prepared, self.answers, self.probe_runs, self.pools):
            cache.clear()
