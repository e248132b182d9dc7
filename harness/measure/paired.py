"""The verdict on re-measured pairs (base and new code timed back to back): a signed-rank interval that stays valid
with heavy-tailed pairs, and the guard that keeps a loaded machine's noise from being called a regression.

Why (issue 35; figures in docs/regressions.md): under load (load average 4-5 on this 2-core VM) a pair's log ratio
has tails to +-4, and a Student t interval on 12 such pairs called unchanged code 'slower' (1.056-233). Two
answers, both needed:

- The interval is the Wilcoxon signed-rank one (the order statistics of the pairs' Walsh averages, Hollander &
  Wolfe ch. 3; R's wilcox.test(paired, conf.int=TRUE)) around the Hodges-Lehmann estimate: distribution-free,
  so a burst moves it by one rank, not by its size. It needs only that unchanged code's log ratios are symmetric
  about 0, which the alternating order (ABBA) of each pair gives. Its price: n pairs cannot reach a one-sided
  level below 2^-n, so a family-wise level needs log2(keys / FAMILY_ALPHA) pairs (8 keys: 8 pairs).
- A test is valid only while a pair's two halves see the same machine. When the pairs spread beyond what a
  quiet machine gives, or the machine was overloaded during the re-measurement and the key's pairs show its
  bursts, they measure the machine, not the code: such a key is 'undecided', with why and what would decide it,
  never 'slower'.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from harness.measure.stats import (FAMILY_ALPHA, SLOWER, FASTER, UNCHANGED, UNDECIDED, GateConfig, GateVerdict,
                                   NOT_POSITIVE, counts_as_change, finite_exp, fmt_ratio, iqr)

#: a run or re-measurement with a 1-minute load average above this many times the CPU count shared its machine
#: with other work (runnable processes outnumbered the CPUs)
BUSY_LOAD_PER_CPU = 1.0
#: the most a key's pairs may spread (normalized IQR of their log ratios) and still be judged: quiet pairs on this
#: VM have an IQR of 0.09 (sd ~0.07); beyond 0.3 (pairs typically 1.35x apart) they measure the machine
PAIR_SPREAD_LIMIT = 0.3
#: a pair whose log ratio lies farther than this from the estimate (2x) is a burst of the machine
BURST = math.log(2.0)
#: interquartile range of a normal distribution in standard deviations
IQR_PER_SD = 1.349
#: above this many pairs the signed-rank null distribution is approximated by a normal one
EXACT_SIGNED_RANK = 60


@functools.lru_cache(maxsize=None)
def _signed_rank_counts(n: int) -> tuple[int, ...]:
    """How many of the 2^n sign patterns give each signed-rank sum W+ = 0..n(n+1)/2: the exact null distribution
    (each rank 1..n is in W+ or not)."""
    counts = [1]
    for rank in range(1, n + 1):
        grown = counts + [0] * rank
        for w, c in enumerate(counts):
            grown[w + rank] += c
        counts = grown
    return tuple(counts)


def pairs_needed(alpha: float) -> int:
    """Fewest pairs for which a one-sided signed-rank bound at level alpha exists: 2^-n <= alpha."""
    return max(1, math.ceil(math.log2(1 / alpha) - 1e-12))


def _walsh_rank(n: int, alpha: float) -> int:
    """k such that the k-th smallest (and k-th largest) of the n(n+1)/2 Walsh averages bounds the centre of the
    pairs at one-sided level alpha: the largest k with P(W+ <= k - 1) <= alpha; 0 when no bound exists."""
    if n <= EXACT_SIGNED_RANK:
        counts, total = _signed_rank_counts(n), 2 ** n
        below, k = 0, 0
        for c in counts:
            if (below + c) / total > alpha + 1e-12:
                break
            below += c
            k += 1
        return k
    from scipy.stats import norm

    mean, sd = n * (n + 1) / 4, math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    return max(0, int(math.floor(mean + norm.ppf(alpha) * sd + 0.5)))


def signed_rank_interval(diffs, alpha: float) -> tuple[float, float, float, bool]:
    """(Hodges-Lehmann estimate, lower, upper, exact) of the centre of paired differences: the median of their
    Walsh averages, bounded by its order statistics at one-sided level alpha each way. `exact` is False when
    there are too few pairs for any bound at that level (the bounds are then the extreme differences)."""
    d = np.asarray(diffs, float)
    n = len(d)
    walsh = np.sort(((d[:, None] + d[None, :]) / 2)[np.triu_indices(n)])
    k = _walsh_rank(n, alpha)
    exact = k >= 1
    k = max(k, 1)
    return float(np.median(walsh)), float(walsh[k - 1]), float(walsh[-k]), exact


def machine_noise(diffs, shift: float, load: tuple[float, int] | None) -> str:
    """Why these pairs measure the machine rather than the code ('' when they can be judged): their spread beyond
    PAIR_SPREAD_LIMIT, or `load` (1-minute load average, CPUs) above BUSY_LOAD_PER_CPU while some pair is a
    burst (farther than BURST from the estimate)."""
    d = np.asarray(diffs, float)
    why = []
    spread = iqr(d) / IQR_PER_SD
    if spread > PAIR_SPREAD_LIMIT:
        why.append(f"the pairs' log ratios spread {spread:.2f} (normalized IQR; judged up to {PAIR_SPREAD_LIMIT:g}, "
                   "quiet pairs here spread ~0.07)")
    if load is not None:
        loadavg, cpus = load
        bursts = int(np.sum(np.abs(d - shift) > BURST))
        if loadavg > BUSY_LOAD_PER_CPU * cpus and bursts:
            why.append(f"load average {loadavg:.1f} on {cpus} CPUs during re-measurement, {bursts} of {len(d)} "
                       f"pairs more than {math.exp(BURST):.0f}x off the estimate")
    return "; ".join(why)


def decide_on_quieter(why: str, loaded: bool = True) -> str:
    """The advice for a key the machine's noise left undecided: what would decide it."""
    quieter = "re-run on a quieter machine (stop the other jobs" + ("; load below the CPU count)" if loaded else ")")
    return (f"the machine's noise is too large to settle this at the gate's level ({why}): {quieter}, or give it "
            "more pairs (--remeasure-max-pairs, --remeasure-budget-s)")


def paired_verdict(base_medians, new_medians, cfg: GateConfig = GateConfig(), *, alpha: float = FAMILY_ALPHA,
                   n_base: int = 0, n_new: int = 0, load: tuple[float, int] | None = None) -> GateVerdict:
    """Verdict on paired rounds: base_medians[i] and new_medians[i] are one round's median latency of the base
    and the new code, timed back to back; `load` is (1-minute load average, CPUs) during the re-measurement.

    The ratio is exp(Hodges-Lehmann estimate of the pairs' log ratios); the interval its signed-rank one at
    one-sided level `alpha` each way. The margin is cfg.min_effect alone: the noise model's A/A spread is that
    of separate runs, which pairing removes. slower: the interval above no change, the estimate beyond the
    margin; unchanged: the estimate within the margin; faster: mirrored; otherwise undecided, with what would
    decide it. Pairs that measure the machine (machine_noise) give undecided, unless their whole interval lies
    within the margin (unchanged).
    """
    base, new = np.asarray(base_medians, float).ravel(), np.asarray(new_medians, float).ravel()
    if len(base) != len(new):
        raise ValueError(f"paired_verdict: {len(base)} base rounds against {len(new)} new ones; pairs need both")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha={alpha!r}: must be in (0, 0.5), e.g. 0.002")
    n = len(base)
    margin = 1 + cfg.min_effect
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
        # pairs that measure the machine settle nothing but a whole interval within the margin: bursts on either
        # side move the estimate, so neither slower, faster nor a pass on the estimate alone
        where = "within" if within else "beyond"
        return GateVerdict(UNDECIDED, f"{interval} {where} the margin {margin:.3f}, but "
                                      + decide_on_quieter(noise, loaded=load is not None), **figures)
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
