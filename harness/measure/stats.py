"""Every statistic that decides a timing verdict: the gate, re-measured pairs, change points, the advisor's ties."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np

from harness.extras import missing
from harness.store.schema import FASTER, NOT_TIMED, SLOWER, UNCHANGED, UNDECIDED

#: smallest ratio of medians that counts as a change of a key between runs: asv's 10 %; runs here drift by ~5 %
MIN_RUN_CHANGE = 0.10
#: smallest ratio that counts between two backends of one run: they share its conditions, so no run-to-run drift
MIN_BACKEND_DIFFERENCE = 0.05
#: smallest absolute change of the median (ms) that counts: CUDA events resolve ~0.5 us, launches jitter ~1 us
ABS_FLOOR_MS = 0.001
#: err_ratio (error over tolerance; > 1 fails) may grow by this much before it is flagged: a quarter of the budget
ERR_GROWTH = 0.25
#: the advisor's Mann-Whitney level (asv's 0.002): one test per pair of backends, so 0.05 would flag ~5 % by chance
ALPHA = 0.002
#: the advisor's level of the t-test on log round medians: rounds spread over the run sample its noise
ROUND_ALPHA = ALPHA
#: fewest samples per side for an advisor's verdict: back-to-back samples can all fall inside one transient
MIN_SAMPLES = 10
#: two-sided confidence of the gate's shift interval (slower needs its lower end above 0)
CONFIDENCE = 0.90
#: chance that any re-measured key of unchanged code is called slower, split over the keys (Bonferroni)
FAMILY_ALPHA = 0.05
#: the gate's margin in A/A standard deviations of the key's log ratio (one false alarm in ~700 normal keys)
NOISE_Z = 3.0
#: PELT penalty on the standardized history: ~12 keeps pure noise of 30 runs free of change points (tested)
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


#: decimals of a printed ratio: a ratio is beyond a margin only where it reads beyond it (1.100 is at 1.100, not past)
RATIO_DECIMALS = 3


def fmt_ratio(x: float) -> str:
    """A ratio for a note: three decimals, or three significant digits when it is wild (1e+148, inf)."""
    return f"{x:.{RATIO_DECIMALS}f}" if abs(x) < 1e4 else f"{x:.3g}"


def family_confidence(confidence: float, keys: int) -> float:
    """The two-sided confidence of each of `keys` intervals so that the chance of calling any key of unchanged code
    slower stays below FAMILY_ALPHA (Bonferroni, one-sided), and never below `confidence`."""
    return max(confidence, 1 - 2 * FAMILY_ALPHA / max(keys, 1))


def _check(config, names: tuple[str, ...], ok, what: str) -> None:
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
    """A key's A/A spread on a testbed: the sd of log(new/base) of its run medians, and the runs it came from."""

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
    #: the fields that are no compare.csv column of their own
    _HIDDEN = ("note",)

    def columns(self) -> dict:
        """Every field not in `_HIDDEN` (the note; a GateVerdict's verdict too), as compare.csv columns."""
        return {k: v for k, v in asdict(self).items() if k not in self._HIDDEN}


@dataclass(frozen=True)
class TimingVerdict(KeyComparison):
    """Two sets of samples compared by a rank test (the advisor's within-run question: are these tied?)."""

    p_value: float = math.nan
    round_p: float = math.nan


@dataclass(frozen=True)
class GateVerdict(KeyComparison):
    """One key's new rounds against its base rounds; `ratio` is exp(Hodges-Lehmann shift of the log round medians)."""

    #: the ratio's confidence interval
    ratio_low: float = math.nan
    ratio_high: float = math.nan
    #: the ratio beyond which a change counts for this key (1 + max(min_effect, noise_z * A/A sigma))
    margin: float = math.nan
    _HIDDEN = ("verdict", "note")


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
    """Whether base_ms -> new_ms moves by at least abs_floor_ms and beyond `margin` (> 1) either way, as printed: a
    ratio at the margin to RATIO_DECIMALS is not beyond it."""
    beyond = round(ratio, RATIO_DECIMALS) > round(margin, RATIO_DECIMALS) or \
        round(ratio * margin, RATIO_DECIMALS) < 1
    return abs(new_ms - base_ms) >= abs_floor_ms and beyond


def _labelled(base, new, base_rounds, new_rounds):
    """Both sides' samples as arrays with their round labels (default: all one round), and their counts."""
    base, new = np.asarray(base, float), np.asarray(new, float)
    base_rounds, new_rounds = (np.zeros(len(x), int) if r is None else np.asarray(r)
                               for x, r in ((base, base_rounds), (new, new_rounds)))
    counts = dict(n_base=len(base), n_new=len(new), rounds_base=len(np.unique(base_rounds)),
                  rounds_new=len(np.unique(new_rounds)))
    return base, new, base_rounds, new_rounds, counts


def min_attainable_p(n_base: int, n_new: int) -> float:
    """Smallest two-sided exact Mann-Whitney p-value with these sample counts (complete separation)."""
    return min(1.0, 2 / math.comb(n_base + n_new, n_base))


def rank_below(counts, level: float) -> int:
    """The largest k with P(X <= k - 1) <= level, X distributed as the exact null `counts` (of X = 0, 1, ...)."""
    total = sum(counts)
    return sum(1 for _ in itertools.takewhile(lambda below: below / total <= level, itertools.accumulate(counts)))


def round_test(base: np.ndarray, new: np.ndarray, base_rounds: np.ndarray,
               new_rounds: np.ndarray) -> tuple[float, list[float], list[float]]:
    """(p, base, new round medians): two-sided t-test on log round medians; nan with < 2 rounds a side."""
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
    """Verdict on raw latency samples (ms) of two backends of one run, `*_rounds` their rounds (default: one):
    slower/faster needs p < alpha, a median ratio beyond 1 + min_effect, abs_floor_ms and round_p < round_alpha."""
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
    """How many of the C(m+n, m) orderings give each Mann-Whitney U = 0..m*n (no ties): the exact null."""
    if m == 0 or n == 0:
        return (1,)
    # the largest value is from the first sample (adds n to U) or from the second (adds nothing)
    with_first = (0,) * n + _u_counts(m - 1, n)
    return tuple(a + b for a, b in itertools.zip_longest(with_first, _u_counts(m, n - 1), fillvalue=0))


def _rank_of_bound(m: int, n: int, confidence: float) -> int:
    """k: the k-th smallest and largest pairwise differences bound the shift at `confidence`; >= 1."""
    alpha = (1 - confidence) / 2 + _SLACK
    if m * n <= EXACT_PAIRS:
        return max(rank_below(_u_counts(m, n), alpha), 1)
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


#: what a first-pass slower key says: the runs' own rounds suspect it, the pairs of --remeasure decide it
CONFIRM = "from the runs' own rounds: compare --remeasure confirms or refutes it (base and new code timed in pairs)"


def gate_verdict(base_ms, new_ms, cfg: GateConfig = GateConfig(), *, base_rounds=None, new_rounds=None,
                 noise: KeyNoise | None = None, loaded: str = "") -> GateVerdict:
    """Verdict on one key's raw latency samples (ms) in two runs, labelled with their rounds; `loaded`: why a run
    was on a loaded machine, which makes a slower key undecided (docs/regressions.md has the rule)."""
    base, new, base_rounds, new_rounds, counts = _labelled(base_ms, new_ms, base_rounds, new_rounds)
    spread = 0.0 if noise is None else cfg.noise_z * noise.aa_sigma  # the margin: max(min_effect, its A/A noise)
    counts["margin"] = margin = 1 + max(cfg.min_effect, finite_exp(spread) - 1)
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
    interval = (f"ratio {fmt_ratio(finite_exp(shift))} ({cfg.confidence * 100:.4g}% interval "
                f"{fmt_ratio(finite_exp(low))}-{fmt_ratio(finite_exp(high))})")
    if not counts_as_change(figures["base_ms"], figures["new_ms"], figures["ratio"], margin, cfg.abs_floor_ms):
        return GateVerdict(UNCHANGED, "", **figures)
    # a loaded run settles neither direction: a burst in the base run makes a slower new run look faster
    if shift > 0 or loaded:
        if shift > 0 and low > 0 and exact and not loaded:
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
    """Indices where a new level starts in run latencies (ms), oldest first: PELT on the log series (ruptures'
    Pelt(model="l1", jump=1), run compiled: measure/pelt_l1.py gives its breakpoints, 1000x sooner)."""
    y = np.log(np.asarray(latency_ms, float))
    if len(y) < 2 * min_size:
        return []
    try:
        from harness.measure.pelt_l1 import pelt_l1_ends
    except ImportError:  # no numba (a node installed from the wheelhouse, --no-deps): ruptures itself, slower
        return ruptures_change_points(y, penalty, min_size)
    ends = pelt_l1_ends(standardized(y), float(penalty), max(int(min_size), 2))  # ruptures' l1 needs 2 a segment
    return [int(e) for e in ends if e < len(y)]


def standardized(y: np.ndarray) -> np.ndarray:
    """A log series over its robust scale, centred: (y - median) / max(robust_sd(steps - their median) / sqrt 2,
    floor) - what PELT's penalty is set against."""
    steps = np.diff(y)
    sigma = max(robust_sd(steps - np.median(steps)) / math.sqrt(2), SIGMA_FLOOR)
    return np.ascontiguousarray((y - np.median(y)) / sigma)


def ruptures_change_points(y: np.ndarray, penalty: float = PENALTY, min_size: int = MIN_SEGMENT) -> list[int]:
    """change_points of a log series through ruptures' own Pelt (Python: seconds a key of hundreds of runs)."""
    try:
        import ruptures as rpt
    except ImportError:
        raise missing("ruptures", "change points") from None

    z = standardized(y).reshape(-1, 1)
    return [e for e in rpt.Pelt(model="l1", min_size=min_size, jump=1).fit(z).predict(pen=penalty) if e < len(y)]
