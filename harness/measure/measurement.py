"""A timing result: the raw per-repetition latencies, the round of each, and the statistics a row reports."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from harness.measure.stats import iqr, round_medians

#: IQR/median above this marks a measurement as noisy (torch.utils.benchmark warns at the same 10%)
NOISE_THRESHOLD = 0.10


@dataclass(frozen=True)
class Measurement:
    """Raw per-repetition latencies (ms), the round of each, and the statistics derived from them."""

    samples_ms: tuple[float, ...]
    mode: str
    threads: int
    #: the round of each sample (empty: all one round)
    round_of: tuple[int, ...] = ()
    #: CUDA: (the events' span over the repetitions, the host clock's around them after synchronisation), ms, for the
    #: clock audit (audit.clock_disagreement); None on the CPU clock
    event_vs_host: tuple[float, float] | None = None
    #: the time `measure` spent besides the samples (estimate and warm-up calls, setup, new inputs, observing), ms, by
    #: the clock of the samples: the clock audit adds it to what the round accounts for
    untimed_ms: float = 0.0

    @classmethod
    def merge(cls, parts: Sequence["Measurement"]) -> "Measurement":
        """The parts' rounds pooled, renumbered in order; mode and threads are the first part's."""
        labels, offset = [], 0
        for rounds in (part.rounds_index() for part in parts):
            labels += [offset + r for r in rounds]
            offset += (max(rounds) + 1) if rounds else 0
        return replace(parts[0], samples_ms=tuple(x for part in parts for x in part.samples_ms), round_of=tuple(labels),
                       event_vs_host=None, untimed_ms=sum(part.untimed_ms for part in parts))

    def rounds_index(self) -> list[int]:
        return list(self.round_of) if self.round_of else [0] * len(self.samples_ms)

    @property
    def n(self) -> int:
        return len(self.samples_ms)

    @property
    def rounds(self) -> int:
        return len(set(self.rounds_index()))

    @property
    def median(self) -> float:
        return float(np.median(self.samples_ms))

    @property
    def iqr(self) -> float:
        return iqr(self.samples_ms)

    @property
    def min(self) -> float:
        return float(np.min(self.samples_ms))

    def round_medians(self) -> list[float]:
        return round_medians(self.samples_ms, self.rounds_index()).tolist()

    @property
    def round_spread(self) -> float:
        medians = self.round_medians()
        return (max(medians) - min(medians)) / self.median if self.median > 0 else float("nan")

    @property
    def noisy(self) -> bool:
        return self.median > 0 and (self.iqr / self.median > NOISE_THRESHOLD or self.round_spread > NOISE_THRESHOLD)

    def latency_columns(self) -> dict:
        """The results columns this measurement fills."""
        return {"latency_ms": self.median, "latency_iqr_ms": self.iqr, "latency_min_ms": self.min,
                "n_samples": self.n, "rounds": self.rounds, "round_spread": self.round_spread, "noisy": self.noisy,
                "timing_mode": self.mode, "threads": self.threads}
