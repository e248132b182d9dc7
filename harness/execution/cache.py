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
#: the verified answers (float64 reference on the CPU, naive errors) that timing judges its calls against, by
#: size: the benchmark stage walks every case again after correctness, once a round, so a run keeps as many as fit
#: (the CPU default matrix's all do) and computes a dropped one again (a large GPU case's: seconds in FP64)
ANSWER_BYTES = 2 * 2 ** 30
#: the semantics probes' runs (tiny tensors), shared by the several questions asked of one backend in a row
PROBE_RUNS = 8
#: inputs a process (a worker, or the in-process executor) drew from a seed: the correctness call and the timing
#: rounds of one case share them; one case at a time, since the inputs of a large case are large
DRAWN_INPUTS = 1
#: the answers a process keeps of each correctness call it ran (Call.keep), for timing to compare its calls' answers
#: with where they run: one over KEPT_ANSWER_BYTES is not kept (its timed answers travel back and are judged against
#: the float64 reference), and a process keeps its newest ones up to KEPT_ANSWERS_BYTES - the CPU default matrix's
#: are 48 MiB a backend (the largest case 10 MiB), and a worker on a GPU keeps them in host memory all run long
KEPT_ANSWER_BYTES = 16 * 2 ** 20
KEPT_ANSWERS_BYTES = 256 * 2 ** 20


class LRU:
    """Holds at most `size` values (and, with `weigh`, at most `max_bytes` of them by weight, the newest always);
    `get(key, make)` computes a missing value once and keeps the newest ones."""

    def __init__(self, size: int, weigh: Callable[[object], int] | None = None, max_bytes: int | None = None):
        if size < 1:
            raise ValueError(f"LRU size={size!r}: must be >= 1")
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

    def clear(self) -> None:
        self._items.clear()

    def _over_weight(self) -> bool:
        return (self.weigh is not None and self.max_bytes is not None
                and sum(self.weigh(v) for v in self._items.values()) > self.max_bytes)


def answer_bytes(prepared) -> int:
    """Bytes a kept verified answer holds: its reference's tensors."""
    return sum(t.numel() * t.element_size() for t in prepared.reference if t is not None)


def kept_bytes(answers: dict) -> int:
    """Bytes a kept correctness call's answers hold."""
    return sum(t.numel() * t.element_size() for t in answers.values())


def cached(cache: LRU | None, key: Hashable, make: Callable[[], T]) -> T:
    """`make()` kept in `cache` under `key`; computed afresh when there is no cache (a probe run on its own)."""
    return make() if cache is None else cache.get(key, make)


@dataclass
class CallCaches:
    """What a process that runs backend calls (a worker, the in-process executor) keeps between them: the inputs it
    drew from a seed last, and its correctness calls' answers by answer id (CallResult.answer_id)."""

    drawn: LRU = field(default_factory=lambda: LRU(DRAWN_INPUTS))
    answers: LRU = field(default_factory=lambda: LRU(1 << 20, kept_bytes, KEPT_ANSWERS_BYTES))


@dataclass
class RunCaches:
    """Every cache of one run, each bounded (see the sizes above), dropped with the run's session."""

    prepared: LRU = field(default_factory=lambda: LRU(PREPARED_CASES))
    answers: LRU = field(default_factory=lambda: LRU(1 << 20, answer_bytes, ANSWER_BYTES))
    probe_runs: LRU = field(default_factory=lambda: LRU(PROBE_RUNS))

    def clear(self) -> None:
        for cache in (self.prepared, self.answers, self.probe_runs):
            cache.clear()
