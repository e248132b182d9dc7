"""Every statistic that decides a timing verdict, in one module, with one vocabulary (the schema's
TIMING_VERDICTS; the advisor shows them as slower/faster/tied, advisor/ranking.ADVISOR_WORDS): the gate between
two runs (`gate_verdict`: compare/runs.py; re-measured pairs: measure/paired.py), change points over a
testbed's history (`change_points`: compare/changes.py) and the advisor's ties between backends timed in one run
(`timing_verdict`: advisor/ranking.py).

Why the gate decides as it does (the measurements are in docs/measurements.md and benchmarks/gate_study.py):

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
- Re-measured keys are decided on *paired* rounds (measure/paired.py): base and new code timed back to back,
  in alternating order, round after round (`asv continuous` times both commits interleaved for the same reason).
  On this VM a key's speed moves 1.1-1.7x over tens of seconds with the host's other load, for both sides
  alike; the difference of a pair's log round medians cancels that, where two separate runs cannot. A run
  made on a loaded machine (`loaded`) cannot settle a slower key at all: only pairs can.

The advisor's question is another one: two backends timed in the same run share its conditions, so it tests
their raw samples (Mann-Whitney), guarded by a t-test on their round medians.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from math import comb

import numpy as np

from harness.store.schema import FASTER, NOT_TIMED, SLOWER, UNCHANGED, UNDECIDED

#: smallest ratio of medians that counts as a change of one key from one run to another (the gate, re-measured
#: pairs, change points over a history): 10 %, asv's default factor, because whole runs on a shared 2-core VM
#: drift by ~5 %; the gate's noise model may raise it per key, never lower it
MIN_RUN_CHANGE = 0.10
#: smallest ratio of medians that counts as a difference between two backends timed in one run (the advisor's
#: ties): half the run-to-run figure, because backends timed in one run share its conditions, so the ~5 % drift
#: between whole runs does not enter; the rank and round tests judge what noise is left
MIN_BACKEND_DIFFERENCE = 0.05
#: smallest absolute change of the median (ms) that counts: CUDA events resolve ~0.5 us, launches jitter ~1 us
ABS_FLOOR_MS = 0.001
#: err_ratio (error over tolerance; > 1 fails) may grow by this much before it is flagged: a quarter of the budget
ERR_GROWTH = 0.25
#: the advisor's significance level of the two-sided Mann-Whitney U test on raw samples (asv uses the same 0.002):
#: a recommendation runs a test per pair of backends, so 0.05 would call ~5 % of equal pairs different by chance
ALPHA = 0.002
#: the advisor's level of the Student t-test on log round medians: samples of one round share its moment's
#: conditions, rounds spread over the run sample the run-to-run noise
ROUND_ALPHA = ALPHA
#: fewest samples per side for an advisor's verdict: samples are taken back to back, so a handful can all fall
#: inside one transient
MIN_SAMPLES = 10
#: two-sided confidence of the gate's shift interval (slower needs its lower end above 0)
CONFIDENCE = 0.90
#: chance that any re-measured key of unchanged code is called slower: each key is tested at
#: FAMILY_ALPHA / (keys re-measured) (Bonferroni), since a gate re-measures tens of keys at once
FAMILY_ALPHA = 0.05
#: the gate's margin is this many A/A standard deviations of the key's log ratio (one false alarm in ~700 keys
#: under normal noise; bursts beyond that are what re-measurement is for)
NOISE_Z = 3.0
#: PELT penalty on the standardized history: ~12 keeps pure noise of 30 runs free of change points (the test
#: plants both); lower finds smaller steps and more false ones
PENALTY = 12.0
#: fewest runs in a history's segment: one noisy run cannot be a segment
MIN_SEGMENT = 3
#: the history noise estimate's floor (log scale): timer-resolution-flat series must not make every wiggle a step
SIGMA_FLOOR = 0.01
#: median absolute deviation -> standard deviation for normal data; robust to the odd burst run
MAD_SCALE = 1.4826
#: above this many pairwise differences the Mann-Whitney null distribution is approximated by a normal one
EXACT_PAIRS = 400
#: floating-point slack on a level: 1 - 0.9 is 0.0999...98, and 1/20 must still count as 0.05
_SLACK = 1e-12

#: the largest x with math.exp(x) finite: a ratio beyond it is reported as inf, not an OverflowError
_MAX_LOG = math.log(np.finfo(float).max)
NOT_POSITIVE = "a round median is not positive: timer resolution too coarse"
_LEVEL = lambda v: 0 < v < 1  # noqa: E731
_NONNEGATIVE = lambda v: math.isfinite(v) and v >= 0  # noqa: E731


def finite_exp(x: float) -> float:
    """math.exp that answers inf where the float range ends (a log ratio of wild timings), never OverflowError."""
    return math.exp(x) if x <= _MAX_LOG else math.inf


def fmt_ratio(x: float) -> str:
    """A ratio for a note: three decimals, or three significant digits when it is wild (1e+148, inf)."""
    return f"{x:.3f}" if abs(x) < 1e4 else f"{x:.3g}"


def _check(config, names: tuple[str, ...], ok, what: str) -> None:
    """A one-line error naming the first of `names` whose value `ok` refuses, and what is allowed."""
    for name in names:
        value = getattr(config, name)
        if not ok(value):
            raise ValueError(f"{type(config).__name__}: {name}={value!r}: must be {what}")


@dataclass(frozen=True)
class TieConfig:
    """The advisor's thresholds for two backends of one run; see the module constants for why each default."""

    min_effect: float = MIN_BACKEND_DIFFERENCE
    alpha: float = ALPHA
    abs_floor_ms: float = ABS_FLOOR_MS
    min_samples: int = MIN_SAMPLES
    round_alpha: float = ROUND_ALPHA

    def __post_init__(self):
        _check(self, ("alpha", "round_alpha"), _LEVEL, "in (0, 1), e.g. 0.002")
        _check(self, ("min_samples",), lambda v: v >= 1, ">= 1")
        _check(self, ("min_effect", "abs_floor_ms"), _NONNEGATIVE, "a finite number >= 0")


@dataclass(frozen=True)
class GateConfig:
    """The gate's thresholds between two runs; see the module constants for why each default."""

    min_effect: float = MIN_RUN_CHANGE
    confidence: float = CONFIDENCE
    noise_z: float = NOISE_Z
    abs_floor_ms: float = ABS_FLOOR_MS
    err_growth: float = ERR_GROWTH

    def __post_init__(self):
        _check(self, ("confidence",), _LEVEL, "in (0, 1), e.g. 0.9")
        _check(self, ("min_effect", "noise_z", "abs_floor_ms", "err_growth"), _NONNEGATIVE, "a finite number >= 0")


@dataclass(frozen=True)
class KeyNoise:
    """A key's A/A spread on a testbed: the standard deviation of log(new/base) of its run medians between two
    runs of unchanged code, and how many runs it was estimated from."""

    aa_sigma: float
    runs: int = 0


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


def iqr(samples) -> float:
    """Interquartile range (np.percentile's linear interpolation), NaN for no samples."""
    samples = np.asarray(samples, float)
    return float(np.subtract(*np.percentile(samples, [75, 25]))) if len(samples) else math.nan


def robust_sd(deviations) -> float:
    """Standard deviation of deviations from their centre, from their median absolute value (NaN for none)."""
    deviations = np.asarray(deviations, float)
    return float(MAD_SCALE * np.median(np.abs(deviations))) if len(deviations) else math.nan


def round_medians(ms, rounds) -> np.ndarray:
    """The median latency of each round, in round order."""
    ms, rounds = np.asarray(ms, float), np.asarray(rounds)
    return np.array([np.median(ms[rounds == r]) for r in np.unique(rounds)], float)


def counts_as_change(base_ms: float, new_ms: float, ratio: float, margin: float, abs_floor_ms: float = 0.0) -> bool:
    """Whether a move of the median from base_ms to new_ms (ratio new/base) counts: by at least abs_floor_ms, and
    beyond `margin` (a ratio > 1) either way."""
    return abs(new_ms - base_ms) >= abs_floor_ms and (ratio > margin or ratio * margin < 1)


def _labelled(base, new, base_rounds, new_rounds):
    """Both sides' samples as arrays with their round labels (default: all one round), and their counts."""
    base, new = np.asarray(base, float), np.asarray(new, float)
    base_rounds = np.zeros(len(base), int) if base_rounds is None else np.asarray(base_rounds)
    new_rounds = np.zeros(len(new), int) if new_rounds is None else np.asarray(new_rounds)
    counts = dict(n_base=len(base), n_new=len(new), rounds_base=len(np.unique(base_rounds)),
                  rounds_new=len(np.unique(new_rounds)))
    return base, new, base_rounds, new_rounds, counts


def min_attainable_p(n_base: int, n_new: int) -> float:
    """Smallest two-sided exact Mann-Whitney p-value with these sample counts (complete separation)."""
    return min(1.0, 2 / comb(n_base + n_new, n_base))


def round_test(base: np.ndarray, new: np.ndarray, base_rounds: np.ndarray,
               new_rounds: np.ndarray) -> tuple[float, list[float], list[float]]:
    """(p, base round medians, new round medians): two-sided Student t-test on the log medians of the rounds;
    nan when either side has fewer than two rounds."""
    from scipy.stats import ttest_ind

    lb, ln = round_medians(base, base_rounds).tolist(), round_medians(new, new_rounds).tolist()
    if min(len(lb), len(ln)) < 2 or min(lb + ln) <= 0:
        return float("nan"), lb, ln
    x, y = np.log(lb), np.log(ln)
    if np.ptp(x) == 0 and np.ptp(y) == 0:  # identical rounds (timer granularity): t is undefined
        return (1.0 if x[0] == y[0] else 0.0), lb, ln
    return float(ttest_ind(y, x, equal_var=True).pvalue), lb, ln


def timing_verdict(base, new, cfg: TieConfig = TieConfig(), *, base_rounds=None,
                   new_rounds=None) -> TimingVerdict:
    """Verdict on raw latency samples (ms) of two backends of one run: slower / faster / unchanged / undecided.

    `*_rounds` label each sample with its measurement round (default: all one round). Undecided below
    min_samples per side. slower/faster needs all of: p < alpha (rank test on the samples), a pooled median
    ratio beyond 1 + min_effect (or its inverse), a median change of at least abs_floor_ms and, when both
    sides have >= 2 rounds, round_p < round_alpha (the difference holds across rounds, not in one transient).
    """
    from scipy.stats import mannwhitneyu

    base, new, base_rounds, new_rounds, counts = _labelled(base, new, base_rounds, new_rounds)
    if len(base) == 0 and len(new) == 0:
        return TimingVerdict(NOT_TIMED, **counts)
    if len(base) == 0 or len(new) == 0:
        return TimingVerdict(UNDECIDED, f"samples only in the {'new' if len(new) else 'base'} run", **counts)
    base_ms, new_ms = float(np.median(base)), float(np.median(new))
    ratio = new_ms / base_ms if base_ms > 0 else np.inf
    p = float(mannwhitneyu(new, base, alternative="two-sided").pvalue)
    round_p, base_medians, new_medians = round_test(base, new, base_rounds, new_rounds)
    figures = dict(counts, base_ms=base_ms, new_ms=new_ms, ratio=ratio, p_value=p, round_p=round_p)
    if min(len(base), len(new)) < cfg.min_samples or min_attainable_p(len(base), len(new)) >= cfg.alpha:
        return TimingVerdict(UNDECIDED, f"too few samples ({len(base)} vs {len(new)}; need >= {cfg.min_samples} "
                                          f"per side and enough for p < {cfg.alpha:g}): raise the timing budget",
                             **figures)
    if not counts_as_change(base_ms, new_ms, ratio, 1 + cfg.min_effect, cfg.abs_floor_ms):
        return TimingVerdict(UNCHANGED, **figures)
    if p >= cfg.alpha:
        return TimingVerdict(UNDECIDED, f"ratio {ratio:.3f} but p={p:.2g} >= {cfg.alpha:g}: too noisy, rerun with "
                                          "more samples", **figures)
    fmt = "/".join
    rounds_note = (f"round medians {fmt(f'{m:.3g}' for m in base_medians)} -> "
                   f"{fmt(f'{m:.3g}' for m in new_medians)} ms")
    if np.isfinite(round_p):
        # the rounds must move the same way as the pooled median (the t-test is two-sided)
        same_way = (np.mean(np.log(new_medians)) > np.mean(np.log(base_medians))) == (ratio > 1)
        if round_p >= cfg.round_alpha or not same_way:
            return TimingVerdict(UNDECIDED, f"ratio {ratio:.3f} but not across rounds ({rounds_note}, "
                                              f"p={round_p:.2g}{'' if same_way else ', the other way'}): conditions "
                                              "changed during a run; rerun", **figures)
        note = ""
    elif min(len(base_medians), len(new_medians)) < 2:
        note = "one round in a run: a transient during it cannot be told apart"
    else:
        note = f"no round test: a round median is not positive ({rounds_note})"
    return TimingVerdict(SLOWER if ratio > 1 else FASTER, note, **figures)


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
    least `confidence` (exact up to EXACT_PAIRS pairs, normal approximation above); 1 is the widest."""
    alpha = (1 - confidence) / 2 + _SLACK
    if m * n <= EXACT_PAIRS:
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
    # complete separation is the rarest outcome: below that level no interval exists
    exact = len(x) * len(y) > EXACT_PAIRS or min_attainable_p(len(x), len(y)) <= 1 - confidence + 2 * _SLACK
    return float(np.median(diffs)), float(diffs[k - 1]), float(diffs[-k]), exact


def margin_for(cfg: GateConfig, noise: KeyNoise | None) -> float:
    """The ratio beyond which a change of this key counts: 1 + max(min_effect, noise_z * its A/A sigma)."""
    spread = 0.0 if noise is None else cfg.noise_z * noise.aa_sigma
    return 1 + max(cfg.min_effect, finite_exp(spread) - 1)


#: what a first-pass slower key says: the runs' own rounds suspect it, the pairs of --remeasure decide it
CONFIRM = "from the runs' own rounds: compare --remeasure confirms or refutes it (base and new code timed in pairs)"


def gate_verdict(base_ms, new_ms, cfg: GateConfig = GateConfig(), *, base_rounds=None, new_rounds=None,
                 noise: KeyNoise | None = None, loaded: str = "") -> GateVerdict:
    """Verdict on one key's raw latency samples (ms) in two runs, each labelled with its measurement round.

    slower: the shift's interval excludes 0 and the estimate exceeds the margin; faster: the mirror image;
    undecided: the estimate exceeds the margin (either way toward slower) but the interval does not exclude no
    change - a suspected regression, re-measure it; unchanged: otherwise (the estimate is within the margin, or
    a speed-up is not established). `loaded` says why a run was made on a loaded machine: its rounds then
    measured the machine as much as the code, so a key they find slower is undecided until pairs decide it.
    """
    base, new, base_rounds, new_rounds, counts = _labelled(base_ms, new_ms, base_rounds, new_rounds)
    counts["margin"] = margin = margin_for(cfg, noise)
    if len(base) == 0 and len(new) == 0:
        return GateVerdict(NOT_TIMED, **counts)
    if len(base) == 0 or len(new) == 0:
        return GateVerdict(UNDECIDED, f"timed only in the {'new' if len(new) else 'base'} run", **counts)
    if not (np.isfinite(base).all() and np.isfinite(new).all()):
        return GateVerdict(UNDECIDED, "a latency sample is not finite (inf or NaN): the timer failed", **counts)
    x, y = round_medians(base, base_rounds), round_medians(new, new_rounds)
    if min(x.min(), y.min()) <= 0:
        return GateVerdict(UNDECIDED, NOT_POSITIVE, **counts)
    shift, low, high, exact = shift_interval(np.log(x), np.log(y), cfg.confidence)
    figures = dict(counts, base_ms=float(np.median(base)), new_ms=float(np.median(new)), ratio=finite_exp(shift),
                   ratio_low=finite_exp(low), ratio_high=finite_exp(high))
    interval = (f"ratio {fmt_ratio(finite_exp(shift))} ({cfg.confidence:.0%} interval "
                f"{fmt_ratio(finite_exp(low))}-{fmt_ratio(finite_exp(high))})")
    if not counts_as_change(figures["base_ms"], figures["new_ms"], figures["ratio"], margin, cfg.abs_floor_ms):
        return GateVerdict(UNCHANGED, "", **figures)
    if shift > 0:
        if low > 0 and exact and not loaded:
            return GateVerdict(SLOWER, CONFIRM, **figures)
        why = (f"a run was made on a loaded machine ({loaded}), so its rounds cannot settle it" if loaded
               else "too few rounds for any interval at this confidence" if not exact
               else "the interval includes no change")
        return GateVerdict(UNDECIDED, f"{interval} beyond the margin {margin:.3f}, but {why}: compare --remeasure "
                                      "decides it (base and new code timed in pairs), or run more --rounds", **figures)
    if high < 0 and exact:
        return GateVerdict(FASTER, "", **figures)
    return GateVerdict(UNCHANGED, f"possibly faster, not established: {interval}", **figures)


def change_points(latency_ms, penalty: float = PENALTY, min_size: int = MIN_SEGMENT) -> list[int]:
    """Indices where a new level starts in a series of run latencies (ms), oldest first.

    The series on a log scale, standardized by a robust noise estimate (the MAD of successive differences, which
    a step does not inflate); ruptures' PELT with the l1 cost (a median per segment, so an outlier run pulls
    nothing), segments of at least `min_size` runs and a BIC-like penalty. Whether a step is large enough to
    report is counts_as_change's rule, as everywhere (compare/changes.detect_changes).
    """
    import ruptures as rpt

    y = np.log(np.asarray(latency_ms, float))
    if len(y) < 2 * min_size:
        return []
    steps = np.diff(y)
    sigma = max(robust_sd(steps - np.median(steps)) / math.sqrt(2), SIGMA_FLOOR)
    z = ((y - np.median(y)) / sigma).reshape(-1, 1)
    ends = rpt.Pelt(model="l1", min_size=min_size, jump=1).fit(z).predict(pen=penalty)
    return [e for e in ends if e < len(y)]
