"""Timing fidelity: the harness's timer against an independent one on the same call, interleaved in blocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from harness.measure.measurement import Measurement
from harness.measure.timing import TimingConfig, measure

#: |ratio - 1| the harness's timer is meant to stay within
TOLERANCE = 0.03

#: the tag (case id prefix) of the fidelity row the benchmark stage writes: a measurement, not a semantics question
FIDELITY_TAG = "fidelity"


def independent_samples_ms(fn: Callable[[], object], device: torch.device, calls: int,
                           budget_ms: float) -> tuple[list[float], str]:
    """(latencies in ms, timer name): torch.utils.benchmark.Timer on CPU, triton do_bench on GPU."""
    if device.type == "cuda":
        from triton.testing import do_bench
        return [float(do_bench(fn, warmup=max(1, int(budget_ms / 4)), rep=max(1, int(budget_ms)),
                               return_mode="median"))], "triton.do_bench"
    from torch.utils.benchmark import Timer
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return [timer.timeit(number=1).median * 1e3 for _ in range(calls)], "torch.utils.benchmark.Timer"


@dataclass(frozen=True)
class Fidelity:
    """Harness / independent timer: `blocks` holds each block's (harness, independent) samples (ms)."""

    blocks: tuple[tuple[tuple[float, ...], tuple[float, ...]], ...]
    harness: Measurement
    independent: str

    @property
    def independent_ms(self) -> float:
        return float(np.median([x for _, theirs in self.blocks for x in theirs]))

    def block_ratios(self) -> np.ndarray:
        """Each block's harness median over its independent median."""
        return np.array([np.median(ours) / np.median(theirs) for ours, theirs in self.blocks], float)

    @property
    def ratio(self) -> float:
        """Median of the block ratios: a block slow for one timer moves it by nothing."""
        return float(np.median(self.block_ratios()))

    @property
    def spread(self) -> float:
        """Half-width of the 90% bootstrap interval of the ratio, resampling whole blocks (seeded)."""
        ratios = self.block_ratios()
        boot = np.median(ratios[np.random.default_rng(0).integers(0, len(ratios), (400, len(ratios)))], axis=1)
        lo, hi = np.percentile(boot, [5, 95])
        return float(hi - lo) / 2

    @property
    def noisy(self) -> bool:
        """The ratio is uncertain by more than the tolerance: the machine, not the timers, decides the figure."""
        return self.spread > TOLERANCE

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1) <= TOLERANCE

    def describe(self) -> str:
        verdict = ("too noisy to tell" if self.noisy else
                   f"{'within' if self.within else 'OUTSIDE'} +-{TOLERANCE:.0%}")
        return (f"harness/{self.independent} = {self.ratio:.3f} (+-{self.spread:.1%}, {len(self.blocks)} "
                f"interleaved blocks): {verdict}")

    def columns(self) -> dict:
        return {"ratio": self.ratio, "spread": self.spread, "blocks": len(self.blocks), "noisy": self.noisy,
                "harness_ms": self.harness.median, "independent_ms": self.independent_ms,
                "independent": self.independent, "harness_mode": self.harness.mode, "n_samples": self.harness.n}


def fidelity(fn: Callable[[], object], device: torch.device, *, blocks: int = 30, calls: int = 10,
             block_ms: float = 50.0) -> Fidelity:
    """Time `fn` with the harness and the independent timer in `blocks` alternating blocks (ABBA order)."""
    # warm both up
    estimate = measure(fn, device=device, config=TimingConfig(warmup_ms=block_ms, budget_ms=block_ms)).median
    exact = TimingConfig(warmup_ms=0.0, budget_ms=block_ms, min_reps=calls, max_reps=calls)
    per_block = TimingConfig(warmup_ms=0.0, budget_ms=block_ms) if device.type == "cuda" else exact
    timers = {"harness": lambda: measure(fn, device=device, config=per_block, estimate_ms=estimate),
              "independent": lambda: independent_samples_ms(fn, device, calls, block_ms)}
    parts, pairs = [], []
    for block in range(blocks):
        order = ("harness", "independent") if block % 4 in (0, 3) else ("independent", "harness")  # ABBA
        got = {who: timers[who]() for who in order}
        (theirs, name), ours = got["independent"], got["harness"]
        parts.append(ours)
        pairs.append((tuple(ours.samples_ms), tuple(theirs)))
    return Fidelity(tuple(pairs), Measurement.merge(parts), name)
