"""The verdict on re-measured pairs: a signed-rank interval, and the guard that keeps machine noise from failing it."""

from __future__ import annotations

import functools
import math

import numpy as np

from harness.measure.stats import (FAMILY_ALPHA, SLOWER, FASTER, UNCHANGED, UNDECIDED, GateConfig, GateVerdict,
                                   NOT_POSITIVE, counts_as_change, finite_exp, fmt_ratio, iqr, rank_below)

#: a 1-minute load average above this many times the CPU count: runnable processes outnumbered the CPUs
BUSY_LOAD_PER_CPU = 1.0
#: the most a key's pairs may spread (normalized IQR of log ratios) and be judged: quiet pairs here spread ~0.07
PAIR_SPREAD_LIMIT = 0.3
#: a pair whose log ratio lies farther than this from the estimate (2x) is a burst of the machine
BURST = math.log(2.0)
#: interquartile range of a normal distribution in standard deviations
IQR_PER_SD = 1.349
#: above this many pairs the signed-rank null distribution is approximated by a normal one
EXACT_SIGNED_RANK = 60


@functools.lru_cache(maxsize=None)
def _signed_rank_counts(n: int) -> tuple[int, ...]:
    """How many of the 2^n sign patterns give each signed-rank sum W+ = 0..n(n+1)/2: the exact null."""
    counts = [1]
    for rank in range(1, n + 1):
        counts = [a + b for a, b in zip(counts + [0] * rank, [0] * rank + counts)]
    return tuple(counts)


def pairs_needed(alpha: float) -> int:
    """Fewest pairs for which a one-sided signed-rank bound at level alpha exists: 2^-n <= alpha."""
    return max(1, math.ceil(math.log2(1 / alpha) - 1e-12))


def _walsh_rank(n: int, alpha: float) -> int:
    """The largest k with P(W+ <= k - 1) <= alpha: the Walsh averages' bounding rank; 0: no bound."""
    if n <= EXACT_SIGNED_RANK:
        return rank_below(_signed_rank_counts(n), alpha + 1e-12)
    from scipy.stats import norm

    mean, sd = n * (n + 1) / 4, math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    return max(0, int(math.floor(mean + norm.ppf(alpha) * sd + 0.5)))


def signed_rank_interval(diffs, alpha: float) -> tuple[float, float, float, bool]:
    """(Hodges-Lehmann estimate, lower, upper, exact) of the centre of paired differences: the median of their
    Walsh averages and its order statistics at one-sided level alpha each way; not `exact`: too few pairs for any
    bound (the bounds are then the extreme differences)."""
    d = np.asarray(diffs, float)
    walsh = np.sort(((d[:, None] + d[None, :]) / 2)[np.triu_indices(len(d))])
    k = _walsh_rank(len(d), alpha)
    return float(np.median(walsh)), float(walsh[max(k, 1) - 1]), float(walsh[-max(k, 1)]), k >= 1


def machine_noise(diffs, shift: float, load: tuple[float, int] | None) -> str:
    """Why these pairs measure the machine rather than the code ('' when they can be judged): their spread beyond
    PAIR_SPREAD_LIMIT, or `load` (1-minute load average, CPUs) above BUSY_LOAD_PER_CPU while some pair is a
    burst (farther than BURST from the estimate)."""
    d, why = np.asarray(diffs, float), []
    spread = iqr(d) / IQR_PER_SD
    if spread > PAIR_SPREAD_LIMIT:
        why.append(f"the pairs' log ratios spread {spread:.2f} (normalized IQR; judged up to {PAIR_SPREAD_LIMIT:g}, "
                   "quiet pairs here spread ~0.07)")
    bursts = int(np.sum(np.abs(d - shift) > BURST))
    if load is not None and load[0] > BUSY_LOAD_PER_CPU * load[1] and bursts:
        why.append(f"load average {load[0]:.1f} on {load[1]} CPUs during re-measurement, {bursts} of {len(d)} "
                   f"pairs more than {math.exp(BURST):.0f}x off the estimate")
    return "; ".join(why)


def paired_verdict(base_medians, new_medians, cfg: GateConfig = GateConfig(), *, alpha: float = FAMILY_ALPHA,
                   n_base: int = 0, n_new: int = 0, load: tuple[float, int] | None = None) -> GateVerdict:
    """Verdict on paired rounds: base_medians[i], new_medians[i] are one round's median (ms) of the base and new
    code, back to back; `load` is (1-minute load average, CPUs) meanwhile. Margin: cfg.min_effect alone."""
    base, new = np.asarray(base_medians, float).ravel(), np.asarray(new_medians, float).ravel()
    if len(base) != len(new):
        raise ValueError(f"paired_verdict: {len(base)} base rounds against {len(new)} new ones; pairs need both")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha={alpha!r}: must be in (0, 0.5), e.g. 0.002")
    n, margin = len(base), 1 + cfg.min_effect
    counts = dict(n_base=n_base, n_new=n_new, rounds_base=n, rounds_new=n, margin=margin)
    if n < 2:
        return GateVerdict(UNDECIDED, f"{n} paired round(s): at least 2 are needed", **counts)
    if not (np.isfinite(base).all() and np.isfinite(new).all()):
        return GateVerdict(UNDECIDED, "a round median is not finite (inf or NaN): the timer failed", **counts)
    if min(base.min(), new.min()) <= 0:
        return GateVerdict(UNDECIDED, NOT_POSITIVE, **counts)
    diffs = np.log(new) - np.log(base)
    shift, low, high, exact = signed_rank_interval(diffs, alpha)
    figures = dict(counts, base_ms=float(np.median(base)), new_ms=float(np.median(new)), ratio=finite_exp(shift),
                   ratio_low=finite_exp(low), ratio_high=finite_exp(high))
    interval = (f"ratio {fmt_ratio(finite_exp(shift))} over {n} paired rounds ({1 - 2 * alpha:.2%} signed-rank "
                f"interval {fmt_ratio(finite_exp(low))}-{fmt_ratio(finite_exp(high))})")
    noise = machine_noise(diffs, shift, load)
    within = not counts_as_change(figures["base_ms"], figures["new_ms"], figures["ratio"], margin, cfg.abs_floor_ms)
    if noise and not (within and exact and finite_exp(high) <= margin):
        # bursts on either side move the estimate: only a whole interval within the margin settles such pairs
        # the advice: what would decide a key the machine's noise left undecided
        where, loaded = ("within" if within else "beyond"), ("; load below the CPU count" if load is not None else "")
        return GateVerdict(UNDECIDED, f"{interval} {where} the margin {margin:.3f}, but the machine's noise is too "
                                      f"large to settle this at the gate's level ({noise}): re-run on a quieter "
                                      f"machine (stop the other jobs{loaded}), or give it more pairs "
                                      "(--remeasure-max-pairs, --remeasure-budget-s)", **figures)
    if within:
        return GateVerdict(UNCHANGED, interval, **figures)
    if shift > 0:
        if low > 0 and exact:
            return GateVerdict(SLOWER, interval, **figures)
        why = (f"{n} pairs cannot reach the family level (at least {pairs_needed(alpha)} are needed)" if not exact
               else "the interval includes no change")
        return GateVerdict(UNDECIDED, f"{interval} beyond the margin {margin:.3f}, but {why}: more pairs would "
                                      "decide it (--remeasure-max-pairs, --remeasure-budget-s)", **figures)
    if high < 0 and exact:
        return GateVerdict(FASTER, interval, **figures)
    return GateVerdict(UNCHANGED, f"possibly faster, not established: {interval}", **figures)
