"""The gate's decision for one timed key: the shift between the two runs' round medians, its confidence interval,
and a margin from the testbed's noise model.

Why this statistic (the measurements are in docs/measurements.md and benchmarks/gate_study.py):

- The unit is the measurement round, not the sample. Samples of one round are taken back to back and share
  that moment's conditions, so a rank test on hundreds of them calls any burst significant (p ~ 1e-146 for a
  one-round hiccup). Rounds are spread over the run, so they sample what actually varies.
- The shift is the Hodges-Lehmann estimate on the log round medians (the median of all pairwise differences)
  with its distribution-free confidence interval from the Mann-Whitney null distribution (Hollander & Wolfe,
  Nonparametric Statistical Methods, ch. 4; R's wilcox.test(conf.int=TRUE)). One round 1.5x slow in three moves
  a mean by 15 %; it moves the Hodges-Lehmann estimate by nothing.
- A key is slower when its interval excludes no change and the estimate exceeds the margin: the larger of
  --min-effect and `noise_z` times the key's A/A spread on this testbed (compare/noise.py). This is asv's rule
  (a factor and a significance test, `asv continuous`) with the factor learned per key.
- A key whose estimate exceeds the margin without a significant interval is *undecided*, never passed
  silently; `compare --remeasure` re-times such keys (and the slower ones, to confirm) until they are decided,
  as Chromium's Pinpoint re-runs a suspected regression before it reports it.
- Re-measured keys are decided on *paired* rounds (`paired_verdict`): base and new code timed back to back, in
  alternating order, round after round (`asv continuous` times both commits interleaved for the same reason).
  On this VM a key's speed moves 1.1-1.7x over tens of seconds with the host's other load, for both sides
  alike; the difference of a pair's log round medians cancels that, where two separate runs cannot.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

# the same floors as the advisor's within-run statistics (why each: measure/stats.py)
from harness.measure.stats import ABS_FLOOR_MS, ERR_GROWTH, KeyComparison
from harness.store.schema import NOT_TIMED

#: smallest ratio of medians that counts; the testbed's noise model may raise it per key, never lower it.
#: 10 % as asv's default factor: whole runs on a shared 2-core VM drift by ~5 %
MIN_EFFECT = 0.10
#: two-sided confidence of the shift's interval (slower needs its lower end above 0)
CONFIDENCE = 0.90
#: chance that any re-measured key of unchanged code is called slower: each key is tested at
#: FAMILY_ALPHA / (keys re-measured) (Bonferroni), since a gate re-measures tens of keys at once
FAMILY_ALPHA = 0.05
#: the margin is this many A/A standard deviations of the key's log ratio (one false alarm in ~700 keys
#: under normal noise; bursts beyond that are what re-measurement is for)
NOISE_Z = 3.0

GATE_VERDICTS = ("slower", "faster", "unchanged", "undecided", NOT_TIMED)


@dataclass(frozen=True)
class GateConfig:
    """Thresholds of the gate; see the module constants for why each default."""

    min_effect: float = MIN_EFFECT
    confidence: float = CONFIDENCE
    noise_z: float = NOISE_Z
    abs_floor_ms: float = ABS_FLOOR_MS
    err_growth: float = ERR_GROWTH

    def __post_init__(self):
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence={self.confidence!r}: must be in (0, 1), e.g. 0.9")
        for name in ("min_effect", "noise_z", "abs_floor_ms", "err_growth"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}={value!r}: must be a finite number >= 0")


@dataclass(frozen=True)
class KeyNoise:
    """A key's A/A spread on a testbed: the standard deviation of log(new/base) of its run medians between two
    runs of unchanged code, and how many runs it was estimated from."""

    aa_sigma: float
    runs: int = 0


@dataclass(frozen=True)
class GateVerdict(KeyComparison):
    """How one key's new rounds compare with its base rounds; `ratio` is exp(Hodges-Lehmann shift of the log
    round medians)."""

    #: the ratio's confidence interval
    ratio_low: float = math.nan
    ratio_high: float = math.nan
    #: the ratio beyond which a change counts for this key (1 + max(min_effect, noise_z * A/A sigma))
    margin: float = math.nan

    def columns(self) -> dict:
        """Every field but the verdict and note, as compare.csv columns (the verdict is written beside them)."""
        out = super().columns()
        out.pop("verdict")
        return out


@functools.lru_cache(maxsize=None)
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many of the C(m+n, m) orderings give each Mann-Whitney U = 0..m*n (no ties): the exact null
    distribution, by the usual recursion on the largest observation."""
    if m == 0 or n == 0:
        return (1,)
    # the largest value is from the first sample (adds n to U) or from the second (adds nothing)
    with_first, with_second = _u_counts(m - 1, n), _u_counts(m, n - 1)
    counts = [0] * (m * n + 1)
    for u, c in enumerate(with_first):
        counts[u + n] += c
    for u, c in enumerate(with_second):
        counts[u] += c
    return tuple(counts)


def _rank_of_bound(m: int, n: int, confidence: float) -> int:
    """k such that the k-th smallest and k-th largest of the m*n pairwise differences bound the shift with at
    least `confidence` (exact for small samples, normal approximation above 400 pairs); 1 is the widest."""
    alpha = (1 - confidence) / 2 + 1e-12  # 1 - 0.9 is 0.0999...98 in floating point: 1/20 must still count
    if m * n <= 400:
        counts = _u_counts(m, n)
        total, below, k = sum(counts), 0, 0
        for c in counts:  # largest k with P(U <= k - 1) <= alpha
            if (below + c) / total > alpha:
                break
            below += c
            k += 1
        return max(k, 1)
    from scipy.stats import norm

    z = norm.ppf(1 - alpha)
    return max(1, int(math.floor(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12))))


def shift_interval(x: np.ndarray, y: np.ndarray, confidence: float) -> tuple[float, float, float, bool]:
    """(Hodges-Lehmann shift of y over x, lower, upper, exact): the median of y_j - x_i and the order
    statistics of those differences that bound it with `confidence`. `exact` is False when the samples are too
    few for any interval at that confidence (the bounds are then the extreme differences)."""
    diffs = np.sort(np.subtract.outer(np.asarray(y, float), np.asarray(x, float)).ravel())
    k = _rank_of_bound(len(x), len(y), confidence)
    counts = _u_counts(len(x), len(y)) if len(x) * len(y) <= 400 else None
    exact = counts is None or counts[0] / sum(counts) <= (1 - confidence) / 2 + 1e-12
    return float(np.median(diffs)), float(diffs[k - 1]), float(diffs[-k]), exact


def round_medians(ms: np.ndarray, rounds: np.ndarray) -> np.ndarray:
    """The median latency of each round, in round order."""
    return np.array([np.median(ms[rounds == r]) for r in np.unique(rounds)], float)


def margin_for(cfg: GateConfig, noise: KeyNoise | None) -> float:
    """The ratio beyond which a change of this key counts: 1 + max(min_effect, noise_z * its A/A sigma)."""
    spread = 0.0 if noise is None else cfg.noise_z * noise.aa_sigma
    return 1 + max(cfg.min_effect, math.expm1(spread))


def gate_verdict(base_ms, new_ms, cfg: GateConfig = GateConfig(), *, base_rounds=None, new_rounds=None,
                 noise: KeyNoise | None = None) -> GateVerdict:
    """Verdict on one key's raw latency samples (ms), each labelled with its measurement round.

    slower: the shift's interval excludes 0 and the estimate exceeds the margin; faster: the mirror image;
    undecided: the estimate exceeds the margin (either way toward slower) but the interval does not exclude no
    change - a suspected regression, re-measure it; unchanged: otherwise (the estimate is within the margin, or
    a speed-up is not established).
    """
    base, new = np.asarray(base_ms, float), np.asarray(new_ms, float)
    base_rounds = np.zeros(len(base), int) if base_rounds is None else np.asarray(base_rounds)
    new_rounds = np.zeros(len(new), int) if new_rounds is None else np.asarray(new_rounds)
    counts = dict(n_base=len(base), n_new=len(new), rounds_base=len(np.unique(base_rounds)),
                  rounds_new=len(np.unique(new_rounds)), margin=margin_for(cfg, noise))
    if len(base) == 0 and len(new) == 0:
        return GateVerdict(NOT_TIMED, **counts)
    if len(base) == 0 or len(new) == 0:
        return GateVerdict("undecided", f"timed only in the {'new' if len(new) else 'base'} run", **counts)
    x, y = round_medians(base, base_rounds), round_medians(new, new_rounds)
    if min(x.min(), y.min()) <= 0:
        return GateVerdict("undecided", "a round median is not positive: timer resolution too coarse", **counts)
    shift, low, high, exact = shift_interval(np.log(x), np.log(y), cfg.confidence)
    figures = dict(counts, base_ms=float(np.median(base)), new_ms=float(np.median(new)), ratio=math.exp(shift),
                   ratio_low=math.exp(low), ratio_high=math.exp(high))
    margin = math.log(counts["margin"])
    interval = f"ratio {math.exp(shift):.3f} ({cfg.confidence:.0%} interval {math.exp(low):.3f}-{math.exp(high):.3f})"
    if abs(figures["new_ms"] - figures["base_ms"]) < cfg.abs_floor_ms or abs(shift) <= margin:
        return GateVerdict("unchanged", "", **figures)
    if shift > 0:
        if low > 0 and exact:
            return GateVerdict("slower", "", **figures)
        why = ("too few rounds for any interval at this confidence" if not exact
               else "the interval includes no change")
        return GateVerdict("undecided", f"{interval} beyond the margin {counts['margin']:.3f}, but {why}: "
                                        "re-measure (compare --remeasure) or run more --rounds", **figures)
    if high < 0 and exact:
        return GateVerdict("faster", "", **figures)
    return GateVerdict("unchanged", f"possibly faster, not established: {interval}", **figures)


def paired_verdict(base_medians, new_medians, cfg: GateConfig = GateConfig(), *, alpha: float = FAMILY_ALPHA,
                   n_base: int = 0, n_new: int = 0) -> GateVerdict:
    """Verdict on paired rounds: base_medians[i] and new_medians[i] are one round's median latency of the base
    and the new code, timed back to back.

    The ratio is exp(Hodges-Lehmann estimate of the pairs' log ratios: the median of their Walsh averages), so a
    burst in one pair moves it little; the interval is the Student t interval of their mean at one-sided level
    `alpha` each way (the issue's "t-interval on log round medians", applied to pairs), which a burst widens:
    on this VM pairs' log ratios have an interquartile range of 0.09 and tails to +-0.6. The margin is
    cfg.min_effect alone: the noise model's A/A spread is the spread of separate runs, which pairing removes.
    Verdicts as gate_verdict's: slower needs the interval above no change and the estimate beyond the margin;
    an estimate within the margin is unchanged; beyond it without a significant interval, undecided (more
    pairs are needed).
    """
    from scipy.stats import t as student_t

    base, new = np.asarray(base_medians, float), np.asarray(new_medians, float)
    if len(base) != len(new):
        raise ValueError(f"paired_verdict: {len(base)} base rounds against {len(new)} new ones; pairs need both")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha={alpha!r}: must be in (0, 0.5), e.g. 0.002")
    n = len(base)
    margin = 1 + cfg.min_effect
    counts = dict(n_base=n_base, n_new=n_new, rounds_base=n, rounds_new=n, margin=margin)
    if n < 2:
        return GateVerdict("undecided", f"{n} paired round(s): at least 2 are needed", **counts)
    if min(base.min(), new.min()) <= 0:
        return GateVerdict("undecided", "a round median is not positive: timer resolution too coarse", **counts)
    diffs = np.log(new) - np.log(base)
    walsh = (diffs[:, None] + diffs[None, :])[np.triu_indices(n)] / 2
    shift = float(np.median(walsh))
    half = float(student_t.ppf(1 - alpha, n - 1) * diffs.std(ddof=1) / math.sqrt(n))
    low, high = float(diffs.mean()) - half, float(diffs.mean()) + half
    figures = dict(counts, base_ms=float(np.median(base)), new_ms=float(np.median(new)), ratio=math.exp(shift),
                   ratio_low=math.exp(low), ratio_high=math.exp(high))
    interval = (f"ratio {math.exp(shift):.3f} over {n} paired rounds ({1 - 2 * alpha:.2%} t interval "
                f"{math.exp(low):.3f}-{math.exp(high):.3f})")
    if abs(figures["new_ms"] - figures["base_ms"]) < cfg.abs_floor_ms or abs(shift) <= math.log(margin):
        return GateVerdict("unchanged", interval, **figures)
    if shift > 0:
        if low > 0:
            return GateVerdict("slower", interval, **figures)
        return GateVerdict("undecided", f"{interval} beyond the margin {margin:.3f}, but the interval includes no "
                                        "change", **figures)
    if high < 0:
        return GateVerdict("faster", interval, **figures)
    return GateVerdict("unchanged", f"possibly faster, not established: {interval}", **figures)
