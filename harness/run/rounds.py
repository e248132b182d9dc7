"""The timing rounds of a run: each key's share of the budget, what its earlier rounds found, whether it goes on."""

from __future__ import annotations

from dataclasses import dataclass

from harness.measure.measurement import Measurement
from harness.measure.timing import TimingConfig
from harness.store.schema import TIMED, Row, TimingKey


@dataclass(frozen=True)
class Round:
    """Which round of a key is timed, and what its earlier rounds found (docs/design/execution.md)."""

    index: int = 0
    count: int = 1
    pooled: Measurement | None = None
    suspicious_reason: str = ""
    memory: tuple[int, str] | None = None
    #: the key's contention so far (schema.Row.contention)
    contention: float | None = None

    def __post_init__(self):
        if not 0 <= self.index < self.count:
            raise ValueError(f"round index={self.index!r} of count={self.count!r}: must be 0 <= index < count")

    def ended(self, reason: str) -> str:
        """The timing reason of a round that ended its key, naming the round after timed ones."""
        if self.pooled is None:
            return reason
        return (f"round {self.index + 1} of {self.count}: {reason}; the latency columns pool the rounds timed "
                "before it")


class RoundSchedule:
    """Times every key in `count` rounds spread over the run, each with 1/count of the budget."""

    def __init__(self, timing: TimingConfig, count: int = 1):
        if count < 1:
            raise ValueError(f"rounds={count!r}: must be >= 1")
        self.timing, self.count = timing, count
        #: timing key -> its latest perf row, for the end-of-run summary
        self.rows: dict[TimingKey, Row] = {}
        self._pooled: dict[TimingKey, Measurement] = {}
        self._memory: dict[TimingKey, tuple[int, str]] = {}

    def timing_of(self, index: int) -> TimingConfig:
        """Round `index`'s share: the min_reps repetitions of a slow key are split over the rounds, not repeated."""
        return self.timing.share(self.count, index)

    def next(self, key: TimingKey, index: int) -> Round | None:
        """Round `index` of `key` with what its earlier rounds found, or None when an earlier round ended the key."""
        before = self.rows.get(key)
        if before is not None and before.timing_status != TIMED:
            return None
        suspicious = before.timing_reason if before is not None and before.suspicious else ""
        return Round(index, self.count, self._pooled.get(key), suspicious or "", self._memory.get(key),
                     None if before is None else before.contention)

    def record(self, row: Row, pooled: Measurement | None) -> None:
        """Remember a round's final row and, when timed, the pooled measurement and its memory."""
        if pooled is not None:
            self._pooled[row.key] = pooled
            self._memory.setdefault(row.key, (row.peak_mem_bytes, row.mem_method))
        self.rows[row.key] = row
