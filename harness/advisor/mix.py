"""A traffic mix: the backend whose weighted attention time over a workload file's shapes is least, overall and per
part of serving (prefill, decode), with a bootstrap interval on how far ahead it is."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from harness.advisor.ranking import Recommendation
from harness.advisor.workload import Workload

#: bootstrap replicates of each backend's per-shape samples, and the interval's coverage
REPLICATES = 2000
COVERAGE = 0.95
#: the parts picked separately (SGLang's --prefill-attention-backend / --decode-attention-backend)
SPLIT = ("prefill", "decode")


@dataclass(frozen=True)
class MixPick:
    """The pick over `shapes`: each backend's weighted time (ms per unit of traffic: its calls' medians times their
    weights, summed), the pick, the next, and the bootstrap's interval of next / pick and the share of replicates in
    which the next came out ahead (the odds the pick is wrong, as far as the samples tell)."""

    part: str
    shapes: tuple[str, ...]
    times: dict[str, float] = field(default_factory=dict)
    winner: str | None = None
    runner_up: str | None = None
    ratio: float = math.nan
    ratio_low: float = math.nan
    ratio_high: float = math.nan
    runner_up_ahead: float = math.nan
    #: backends left out of this part, and why (not ranked on one of its shapes)
    excluded: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        if self.winner is None:
            return f"{self.part}: no backend is verified and timed on all of {len(self.shapes)} shape(s)"
        text = f"{self.part}: {self.winner} ({self.times[self.winner]:.4g} ms of attention per unit of traffic)"
        if self.runner_up is not None:
            text += (f"; next {self.runner_up} {self.ratio:.2f}x its time ({COVERAGE:.0%} interval "
                     f"{self.ratio_low:.2f}-{self.ratio_high:.2f}x; ahead in {self.runner_up_ahead:.1%} of "
                     f"{REPLICATES} resamples)")
        return text


def weighted_time(samples: dict[str, tuple[float, ...]], weights: dict[str, float]) -> float:
    """Σ weight x median latency over the shapes (samples and weights by shape label)."""
    return float(sum(weights[label] * np.median(samples[label]) for label in weights))


def compare(first: str, second: str, workloads: list[Workload], recommendations: dict[str, Recommendation],
            seed: int = 0) -> tuple[float, float, float, float]:
    """second's weighted time over first's on `workloads`: (ratio, interval low, high, share of resamples in which
    second came out ahead); NaN where either is not ranked on every one."""
    weights = {w.label: w.calls_weight for w in workloads}
    try:
        a, b = ({w.label: recommendations[w.label].samples[name] for w in workloads} for name in (first, second))
    except KeyError:
        return (math.nan,) * 4
    boot, tail = _bootstrap(a, b, weights, seed), (1 - COVERAGE) / 2
    return (weighted_time(b, weights) / weighted_time(a, weights), float(np.quantile(boot, tail)),
            float(np.quantile(boot, 1 - tail)), float(np.mean(boot < 1)))


def pick(part: str, workloads: list[Workload], recommendations: dict[str, Recommendation], seed: int = 0) -> MixPick:
    """The backend with the least weighted time over `workloads` (each one's Recommendation by label), among those
    ranked on every one; its margin over the next by a bootstrap of every sample set."""
    labels = tuple(w.label for w in workloads)
    weights = {w.label: w.calls_weight for w in workloads}
    names = list(dict.fromkeys(b for label in labels for b in recommendations[label].table.backend))
    eligible, excluded = {}, {}
    for name in names:
        missing = [label for label in labels if name not in recommendations[label].samples]
        if missing:
            row = recommendations[missing[0]].table
            status = row.loc[row.backend == name, "status"]
            excluded[name] = f"not ranked on {missing[0]}" + (f" ({status.iloc[0]})" if len(status) else "")
        else:
            eligible[name] = {label: recommendations[label].samples[name] for label in labels}
    times = {name: weighted_time(s, weights) for name, s in eligible.items()}
    if not times:
        return MixPick(part, labels, excluded=excluded)
    order = sorted(times, key=times.get)
    winner = order[0]
    if len(order) == 1:
        return MixPick(part, labels, times, winner, excluded=excluded)
    nxt = order[1]
    return MixPick(part, labels, times, winner, nxt, *compare(winner, nxt, workloads, recommendations, seed),
                   excluded=excluded)


def _bootstrap(first: dict[str, tuple[float, ...]], second: dict[str, tuple[float, ...]], weights: dict[str, float],
               seed: int) -> np.ndarray:
    """REPLICATES draws of second's weighted time over first's, each shape's samples resampled with replacement."""
    rng = np.random.default_rng(seed)

    def replicate_times(samples: dict[str, tuple[float, ...]]) -> np.ndarray:
        total = np.zeros(REPLICATES)
        for label, values in samples.items():
            values = np.asarray(values, dtype=float)
            drawn = values[rng.integers(0, len(values), size=(REPLICATES, len(values)))]
            total += weights[label] * np.median(drawn, axis=1)
        return total

    return replicate_times(second) / replicate_times(first)


@dataclass(frozen=True)
class TrafficMix:
    """The overall pick (one backend for every shape, as vLLM needs) and, where the file has both, a pick per part
    (prefill and decode apart, as SGLang allows)."""

    overall: MixPick
    parts: dict[str, MixPick]

    @property
    def split(self) -> bool:
        """Whether prefill and decode are best served by different backends."""
        winners = {p.winner for name, p in self.parts.items() if name in SPLIT}
        return len(self.parts.keys() & set(SPLIT)) == 2 and len(winners) == 2 and None not in winners

    def describe(self) -> list[str]:
        overall = self.overall.describe().replace("overall: ", "overall (one backend for all): ", 1)
        lines = ["traffic mix (weighted attention time; a shape's weight is its share of calls, or its tokens per "
                 "second / tokens a call):", f"  {overall}"]
        lines += [f"  {p.describe()}" for name, p in self.parts.items()]
        if self.split:
            lines.append(f"  prefill and decode are best served apart: {self.parts['prefill'].winner} and "
                         f"{self.parts['decode'].winner} (SGLang can split them; vLLM takes one: "
                         f"{self.overall.winner})")
        return lines


def traffic_mix(workloads: list[Workload], recommendations: dict[str, Recommendation], seed: int = 0) -> TrafficMix:
    """The mix's overall pick and its per-part ones (each part the file has shapes of)."""
    parts = {}
    for part in dict.fromkeys(w.role for w in workloads):
        members = [w for w in workloads if w.role == part]
        if len(members) < len(workloads):  # a part alone only when there is more than one
            parts[part] = pick(part, members, recommendations, seed)
    return TrafficMix(pick("overall", workloads, recommendations, seed), parts)


def weighted(workloads: list[Workload]) -> bool:
    """Whether a file gives the mix's weights (else the overall pick is the rank-based one, ranking.overall)."""
    return any(w.weight is not None or w.tokens_per_s is not None or w.part is not None for w in workloads)
