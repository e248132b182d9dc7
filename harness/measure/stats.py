"""Statistics on raw latency samples within one run, for the advisor's tie groups: is one backend's set of
samples slower than another's? (The gate between runs decides on round medians instead: compare/gate.py.)

Why each threshold has its default, with the measurements behind them, is in docs/measurements.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from math import comb

import numpy as np
from scipy.stats import mannwhitneyu, ttest_ind

from harness.store.schema import NOT_TIMED

#: significance level of the two-sided Mann-Whitney U test on raw samples (asv uses the same 0.002): one test per
#: timed key, hundreds per compare, so 0.05 would call ~5% of unchanged keys "significant" by chance alone
ALPHA = 0.002
#: significance level of the Student t-test on log round medians: samples of one round share its moment's
#: conditions, rounds spread over the run sample the run-to-run noise
ROUND_ALPHA = ALPHA
#: smallest ratio of medians that counts (asv uses 10%, Perfherder 2%); keep it above the testbed's noise
MIN_EFFECT = 0.05
#: smallest absolute change of the median (ms) that counts: CUDA events resolve ~0.5 us, launches jitter ~1 us
ABS_FLOOR_MS = 0.001
#: err_ratio (error over tolerance; > 1 fails) may grow by this much before it is flagged: a quarter of the budget
ERR_GROWTH = 0.25
#: fewest samples per side for a timing verdict: samples are taken back to back, so a handful can all fall
#: inside one transient
MIN_SAMPLES = 10

TIMING_VERDICTS = ("slower", "faster", "unchanged", "inconclusive", NOT_TIMED)


@dataclass(frozen=True)
class CompareConfig:
    """Thresholds of the verdicts; see the module constants for why each default."""

    min_effect: float = MIN_EFFECT
    alpha: float = ALPHA
    abs_floor_ms: float = ABS_FLOOR_MS
    err_growth: float = ERR_GROWTH
    min_samples: int = MIN_SAMPLES
    round_alpha: float = ROUND_ALPHA

    def __post_init__(self):
        if not 0 < self.alpha < 1 or not 0 < self.round_alpha < 1:
            raise ValueError(f"alpha={self.alpha!r}, round_alpha={self.round_alpha!r}: each must be in (0, 1), "
                             "e.g. 0.002")
        if self.min_samples < 1:
            raise ValueError(f"min_samples={self.min_samples!r}: must be >= 1")
        if self.min_effect < 0 or self.abs_floor_ms < 0 or self.err_growth < 0:
            raise ValueError(f"min_effect={self.min_effect!r}, abs_floor_ms={self.abs_floor_ms!r}, "
                             f"err_growth={self.err_growth!r}: each must be >= 0")


@dataclass(frozen=True)
class KeyComparison:
    """How one key's new timings compare with its base ones: the verdict and the figures every method reports."""

    verdict: str
    note: str = ""
    n_base: int = 0
    n_new: int = 0
    rounds_base: int = 0
    rounds_new: int = 0
    base_ms: float = math.nan
    new_ms: float = math.nan
    ratio: float = math.nan

    def columns(self) -> dict:
        """Every field but the note, as compare.csv columns."""
        out = asdict(self)
        out.pop("note")
        return out


@dataclass(frozen=True)
class TimingVerdict(KeyComparison):
    """Two sets of samples compared by a rank test (the advisor's within-run question: are these tied?)."""

    p_value: float = math.nan
    round_p: float = math.nan


def iqr(samples) -> float:
    """Interquartile range (np.percentile's linear interpolation), NaN for no samples."""
    samples = np.asarray(samples, float)
    return float(np.subtract(*np.percentile(samples, [75, 25]))) if len(samples) else math.nan


def min_attainable_p(n_base: int, n_new: int) -> float:
    """Smallest two-sided exact Mann-Whitney p-value with these sample counts (complete separation)."""
    return min(1.0, 2 / comb(n_base + n_new, n_base))


def round_test(base: np.ndarray, new: np.ndarray, base_rounds: np.ndarray,
               new_rounds: np.ndarray) -> tuple[float, list[float], list[float]]:
    """(p, base round medians, new round medians): two-sided Student t-test on the log medians of the rounds;
    nan when either side has fewer than two rounds."""
    lb = [float(np.median(base[base_rounds == r])) for r in np.unique(base_rounds)]
    ln = [float(np.median(new[new_rounds == r])) for r in np.unique(new_rounds)]
    if min(len(lb), len(ln)) < 2 or min(lb + ln) <= 0:
        return float("nan"), lb, ln
    x, y = np.log(lb), np.log(ln)
    if np.ptp(x) == 0 and np.ptp(y) == 0:  # identical rounds (timer granularity): t is undefined
        return (1.0 if x[0] == y[0] else 0.0), lb, ln
    return float(ttest_ind(y, x, equal_var=True).pvalue), lb, ln


def timing_verdict(base, new, cfg: CompareConfig = CompareConfig(), *, base_rounds=None,
                   new_rounds=None) -> TimingVerdict:
    """Verdict on raw latency samples (ms) of one key: slower / faster / unchanged / inconclusive.

    `*_rounds` label each sample with its measurement round (default: all one round). Inconclusive below
    min_samples per side. slower/faster needs all of: p < alpha (rank test on the samples), a pooled median
    ratio beyond 1 + min_effect (or its inverse), a median change of at least abs_floor_ms and, when both
    runs have >= 2 rounds, round_p < round_alpha (the change holds across rounds, not in one transient).
    """
    base, new = np.asarray(base, float), np.asarray(new, float)
    base_rounds = np.zeros(len(base), int) if base_rounds is None else np.asarray(base_rounds)
    new_rounds = np.zeros(len(new), int) if new_rounds is None else np.asarray(new_rounds)
    counts = dict(n_base=len(base), n_new=len(new), rounds_base=len(np.unique(base_rounds)),
                  rounds_new=len(np.unique(new_rounds)))
    if len(base) == 0 and len(new) == 0:
        return TimingVerdict(NOT_TIMED, **counts)
    if len(base) == 0 or len(new) == 0:
        return TimingVerdict("inconclusive", f"samples only in the {'new' if len(new) else 'base'} run", **counts)
    base_ms, new_ms = float(np.median(base)), float(np.median(new))
    ratio = new_ms / base_ms if base_ms > 0 else np.inf
    p = float(mannwhitneyu(new, base, alternative="two-sided").pvalue)
    round_p, base_medians, new_medians = round_test(base, new, base_rounds, new_rounds)
    figures = dict(counts, base_ms=base_ms, new_ms=new_ms, ratio=ratio, p_value=p, round_p=round_p)
    if min(len(base), len(new)) < cfg.min_samples or min_attainable_p(len(base), len(new)) >= cfg.alpha:
        return TimingVerdict("inconclusive", f"too few samples ({len(base)} vs {len(new)}; need >= {cfg.min_samples} "
                                             f"per side and enough for p < {cfg.alpha:g}): raise the timing budget",
                             **figures)
    if abs(new_ms - base_ms) < cfg.abs_floor_ms or max(ratio, 1 / ratio) < 1 + cfg.min_effect:
        return TimingVerdict("unchanged", **figures)
    if p >= cfg.alpha:
        return TimingVerdict("inconclusive", f"ratio {ratio:.3f} but p={p:.2g} >= {cfg.alpha:g}: too noisy, rerun with "
                                             "more samples", **figures)
    fmt = "/".join
    rounds_note = (f"round medians {fmt(f'{m:.3g}' for m in base_medians)} -> "
                   f"{fmt(f'{m:.3g}' for m in new_medians)} ms")
    if np.isfinite(round_p):
        # the rounds must move the same way as the pooled median (the t-test is two-sided)
        same_way = (np.mean(np.log(new_medians)) > np.mean(np.log(base_medians))) == (ratio > 1)
        if round_p >= cfg.round_alpha or not same_way:
            return TimingVerdict("inconclusive", f"ratio {ratio:.3f} but not across rounds ({rounds_note}, "
                                                 f"p={round_p:.2g}{'' if same_way else ', the other way'}): conditions "
                                                 "changed during a run; rerun", **figures)
        note = ""
    elif min(len(base_medians), len(new_medians)) < 2:
        note = "one round in a run: a transient during it cannot be told apart"
    else:
        note = f"no round test: a round median is not positive ({rounds_note})"
    return TimingVerdict("slower" if ratio > 1 else "faster", note, **figures)
