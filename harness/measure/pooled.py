"""The gate's backend-level verdict: did a backend (or a phase of it) get slower, pooling its keys' paired rounds."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.measure.paired import pairs_needed
from harness.measure.stats import FAMILY_ALPHA, FASTER, SLOWER, UNCHANGED, UNDECIDED, finite_exp, fmt_ratio

#: others took this share of every CPU or more while a side was timed: the worker got a sliver of a CPU, and its time
#: is the scheduler's (at load 3 per CPU the share is ~0.75-0.86 on this VM, which still counts). A rule on the gap
#: between the two sides' shares (0.25) was tried and removed: /proc/stat counts in 10 ms ticks, and over rounds of
#: ~0.15 s the two shares of one pair differed by more than that in most pairs beside a bursty load (10 of 12 pairs
#: of an 8x slowdown left out, the key undecided)
SATURATED_SHARE = 0.95
#: the sign test's asymptotic relative efficiency against the t-test (2/pi): keys its decision needs, from a normal
#: approximation
_SIGN_EFFICIENCY = 2 / math.pi


def pair_excluded(base_share: float | None, new_share: float | None) -> str:
    """Why one paired round does not count ('' when it does): either side timed while others took SATURATED_SHARE of
    the CPUs. A share not read (None: no /proc, an older base checkout's server) excludes nothing."""
    shares = [s for s in (base_share, new_share) if s is not None]
    if any(s >= SATURATED_SHARE for s in shares):
        return f"saturated: others took {max(shares):.0%} of the CPUs (counted below {SATURATED_SHARE:.0%})"
    return ""


#: a GroupVerdict's phase when it pools every phase of its backend
ALL_PHASES = "all"


def scope(backend: str, phase: str) -> str:
    """A group in words: 'tiled' for a backend over every phase, 'tiled bwd' for one of its phases."""
    return backend if phase == ALL_PHASES else f"{backend} {phase}"


@dataclass(frozen=True)
class GroupVerdict:
    """One backend's (or backend and phase's) verdict over its keys; `ratio` is exp(the median of the keys' log
    ratios), each key's log ratio the median of its counted pairs' (pair_log_ratios)."""

    backend: str
    phase: str  # ALL_PHASES for the backend over every phase
    verdict: str
    keys: int
    ratio: float = math.nan
    ratio_low: float = math.nan
    ratio_high: float = math.nan
    margin: float = math.nan
    #: key-pairs a decision would still need at the evidence so far (0: decided; inf: nothing points either way)
    more_pairs: float = 0.0
    note: str = ""

    @property
    def settled(self) -> bool:
        return self.verdict in (SLOWER, FASTER, UNCHANGED)


#: a side's round whose fastest sample is over this many times that side's fastest round of the key was slowed
#: throughout by the machine, not by the code (a code change moves every round of its side alike): on this VM at load
#: 4 per CPU, 0.05 ms keys read 15-40 ms for whole rounds (OpenMP threads waiting on a descheduled sibling)
BURST_FACTOR = 4.0


def pair_log_ratios(base_rounds, new_rounds) -> list[float | None]:
    """Per pair of a key's rounds (each a sequence of samples, ms): log(fastest new / fastest base) - the fastest
    sample: timing noise only adds, and under load most samples of a round carry some - or None where either side's
    round is a burst (BURST_FACTOR over the same side's fastest round: judged against the key's other rounds, so a
    first round alone is never one)."""
    b, n = (np.array([min(r) for r in rounds], float) for rounds in (base_rounds, new_rounds))
    if not len(b):
        return []
    keep = (b <= BURST_FACTOR * b.min()) & (n <= BURST_FACTOR * n.min())
    return [float(np.log(x / y)) if k else None for x, y, k in zip(n, b, keep)]


def sign_interval(d, alpha: float) -> tuple[float, float, float, bool]:
    """(median, lower, upper, exact) of the keys' log ratios: the sign test's distribution-free interval for their
    median, the k-th smallest and k-th largest values with P(Binomial(n, 1/2) <= k - 1) <= alpha. A key hit by a burst
    is one sign, whatever its size: k - 1 such keys on one side cannot move a bound (a signed-rank interval's Walsh
    averages pair each burst with every other key, so one burst of e^4 among ten keys moved its bound to e^2)."""
    d = np.sort(np.asarray(d, float))
    n, below, k = len(d), 0, 0
    for j in range(n + 1):  # P(B <= j) for j = 0, 1, ... while it stays within alpha
        below += math.comb(n, j)
        if below / 2.0 ** n > alpha + 1e-12:
            break
        k = j + 1
    k = min(k, (n + 1) // 2)
    return float(np.median(d)), float(d[max(k, 1) - 1]), float(d[-max(k, 1)]), k >= 1


def group_verdict(backend: str, phase: str, log_ratios, margin: float, alpha: float = FAMILY_ALPHA) -> GroupVerdict:
    """Verdict on one group's keys (one log ratio each) at one-sided level `alpha` each way (the caller divides the
    family's level over the groups and the looks): the sign test's interval for the keys' median log ratio
    (sign_interval: robust to keys hit by bursts, each one sign). slower: the interval excludes 1 and the median is
    beyond `margin`; unchanged: the whole interval within [1/margin, margin]; faster mirrored; else undecided."""
    d = np.asarray([x for x in log_ratios if math.isfinite(x)], float)
    if margin <= 1 or not 0 < alpha < 0.5:
        raise ValueError(f"group_verdict: margin={margin!r} must be > 1 and alpha={alpha!r} in (0, 0.5)")
    base = dict(backend=backend, phase=phase, keys=len(d), margin=margin)
    need = pairs_needed(alpha)
    if len(d) < 2:
        return GroupVerdict(verdict=UNDECIDED, more_pairs=max(need - len(d), 1),
                            note=f"{len(d)} key(s) with a counted pair: at least {need} are needed", **base)
    shift, low, high, exact = sign_interval(d, alpha)
    figures = dict(base, ratio=finite_exp(shift), ratio_low=finite_exp(low), ratio_high=finite_exp(high))
    text = (f"ratio {fmt_ratio(figures['ratio'])} over {len(d)} keys ({1 - 2 * alpha:.4g} sign-test interval "
            f"{fmt_ratio(figures['ratio_low'])}-{fmt_ratio(figures['ratio_high'])}, margin {margin:.3f})")
    edge = math.log(margin)
    if exact and low > 0 and shift > edge:
        return GroupVerdict(verdict=SLOWER, note=text, **figures)
    if exact and high < 0 and shift < -edge:
        return GroupVerdict(verdict=FASTER, note=text, **figures)
    if exact and low >= -edge and high <= edge:
        return GroupVerdict(verdict=UNCHANGED, note=text, **figures)
    more = keys_needed(d, alpha, edge) - len(d)
    why = (f"{len(d)} keys cannot reach the level (at least {need} are needed)" if not exact else
           "the interval reaches both sides of the margin")
    return GroupVerdict(verdict=UNDECIDED, more_pairs=max(more, 1), note=f"{text}: {why}", **figures)


def keys_needed(d: np.ndarray, alpha: float, edge: float) -> float:
    """About how many keys' log ratios like `d` a decision at level `alpha` would take (normal approximation of the
    sign test, robust spread): for a direction, (z sd / centre)^2; for no change, (z sd / (edge - |centre|))^2;
    the fewer of the two, never below what the exact test needs; inf when neither can be reached."""
    from scipy.stats import norm

    z = norm.ppf(1 - alpha)
    centre = float(np.median(d))
    sd = max(1.4826 * float(np.median(np.abs(d - centre))), 1e-3)
    ways = [abs(centre) if abs(centre) > edge else 0.0, edge - abs(centre) if abs(centre) < edge * 0.999 else 0.0]
    counts = [(z * sd / w) ** 2 / _SIGN_EFFICIENCY for w in ways if w > 0]
    return max(float(pairs_needed(alpha)), math.ceil(min(counts))) if counts else math.inf
