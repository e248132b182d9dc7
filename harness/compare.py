"""Compare two runs per (case, backend, phase): timing verdicts from raw samples, correctness changes, a gate."""

from __future__ import annotations

import json
from dataclasses import dataclass
from math import comb
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import mannwhitneyu, ttest_ind

from harness.results import KEY, load_results, load_samples

#: Significance level of the two-sided Mann-Whitney U test on raw samples (asv uses the same 0.002).
#: A compare makes one test per timed row, hundreds on the default matrix: at 0.05, two runs drawn
#: from one distribution would show ~5% of rows "significant" by chance alone; at 0.002 fewer than one
#: in 300, and the effect-size gate removes most of those. The price: p < 0.002 needs at least 7 samples
#: a side (2 / C(14, 7) = 0.0006, while 6 a side cannot go below 0.0022), which MIN_SAMPLES covers.
#: What alpha cannot fix is drift *between* runs (other load, clocks): samples taken back to back are not
#: independent of that moment's conditions, so p-values of hundreds of samples are tiny for any systematic
#: shift; that is the job of the round test (ROUND_ALPHA) and of the effect size.
ALPHA = 0.002
#: Significance level of the test across measurement rounds: a Student t-test on the log round medians of
#: the two runs (pooled variance: round-to-round noise is the testbed's, the same in both). Samples of one
#: round share its moment's conditions; rounds spread over the run (`pytest suites --rounds`) sample the
#: run-to-run noise. On this project's 2-core VM one case's keys all ran 30-40% slower for seconds in one
#: of two identical runs while each key's samples agreed within 2-5%: the rank test on samples calls that
#: significant, this test does not unless every round moved. Measured there (3 rounds, 4 degrees of
#: freedom, |t| > 7.2 needed): 1 of 756 keys slower over three pairs of identical runs read both ways (the
#: rank test and effect size alone: 66 of 252), while a 2.2x slowdown was called slower in 91-94% of keys
#: and inconclusive, never unchanged, in the rest. 0.01 caught more (99% at 2.2x, 84% at 1.3x) but flagged
#: 3 of 378 identical keys. The one left: a whole process can run a key 5-11% slower in every round, which
#: no round inside it can reveal (pyperf and asv run rounds in separate processes for that reason).
ROUND_ALPHA = ALPHA
#: Smallest ratio of medians that counts (asv uses 10%, Perfherder 2%). Keep it above the testbed's
#: run-to-run noise, which the report prints (|ratio-1| of timed rows; compare two runs of the same
#: code to read it): on a quiet dedicated GPU a few percent; on this project's shared 2-core CPU VM
#: the median row moved 2% between identical runs but one row in ten moved more than 10%.
MIN_EFFECT = 0.05
#: Smallest absolute change of the median (ms) that counts: CUDA event timing resolves ~0.5 us, and a
#: launch jitters by about a microsecond, so a 5% change of a 10 us kernel is below what was measured.
ABS_FLOOR_MS = 0.001
#: err_ratio (error over tolerance; > 1 fails) may grow by this much before it is flagged: a quarter of
#: the tolerance budget. Smaller moves happen between GPU runs (atomics in backward kernels make errors
#: vary run to run); relative growth of a tiny ratio would flag noise.
ERR_GROWTH = 0.25
#: Fewest samples per side for a timing verdict. Samples are taken back to back, so a handful can all
#: fall inside one transient (another process holding the core, a clock change): on this project's 2-core
#: CI machine, runs under load produced 5-sample measurements 100x off that the rank test alone accepted.
MIN_SAMPLES = 10
#: A run that started or ended with a 1-minute load average above this many times the CPU count shared
#: its machine with other work; its timings are flagged as unreliable in the report.
BUSY_LOAD_PER_CPU = 1.0

BAD = ("fail", "error", "oom")
MISSING = ("unsupported", "unavailable")
VERDICTS = ("slower", "faster", "unchanged", "inconclusive", "not-timed", "base-only", "new-only")
CORRECTNESS = ("same", "worse", "lost", "better", "")


class MismatchedTestbeds(ValueError):
    """The two runs come from different testbeds, so their timings are no regression gate."""


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


def timing_verdict(base: np.ndarray, new: np.ndarray, cfg: CompareConfig = CompareConfig(), *,
                   base_rounds: np.ndarray | None = None, new_rounds: np.ndarray | None = None) -> dict:
    """Verdict on raw latency samples (ms) of one key: slower / faster / unchanged / inconclusive.

    `*_rounds` label each sample with its measurement round (default: all one round). Inconclusive below
    min_samples per side. slower/faster needs all of: p < alpha (rank test on the samples), a pooled median
    ratio beyond 1 + min_effect (or its inverse), a median change of at least abs_floor_ms and, when both
    runs have >= 2 rounds, round_p < round_alpha (the change holds across rounds, not in one transient).
    """
    base, new = np.asarray(base, float), np.asarray(new, float)
    base_rounds = np.zeros(len(base), int) if base_rounds is None else np.asarray(base_rounds)
    new_rounds = np.zeros(len(new), int) if new_rounds is None else np.asarray(new_rounds)
    out = {"n_base": len(base), "n_new": len(new), "rounds_base": len(np.unique(base_rounds)),
           "rounds_new": len(np.unique(new_rounds)), "base_ms": np.nan, "new_ms": np.nan, "ratio": np.nan,
           "p_value": np.nan, "round_p": np.nan}
    if len(base) == 0 and len(new) == 0:
        return {**out, "verdict": "not-timed", "note": ""}
    if len(base) == 0 or len(new) == 0:
        return {**out, "verdict": "inconclusive", "note": f"samples only in the {'new' if len(new) else 'base'} run"}
    base_ms, new_ms = float(np.median(base)), float(np.median(new))
    ratio = new_ms / base_ms if base_ms > 0 else np.inf
    p = float(mannwhitneyu(new, base, alternative="two-sided").pvalue)
    round_p, base_medians, new_medians = round_test(base, new, base_rounds, new_rounds)
    out.update(base_ms=base_ms, new_ms=new_ms, ratio=ratio, p_value=p, round_p=round_p)
    if min(len(base), len(new)) < cfg.min_samples or min_attainable_p(len(base), len(new)) >= cfg.alpha:
        return {**out, "verdict": "inconclusive",
                "note": f"too few samples ({len(base)} vs {len(new)}; need >= {cfg.min_samples} per side and "
                        f"enough for p < {cfg.alpha:g}): raise the timing budget"}
    small = abs(new_ms - base_ms) < cfg.abs_floor_ms or max(ratio, 1 / ratio) < 1 + cfg.min_effect
    if small:
        return {**out, "verdict": "unchanged", "note": ""}
    if p >= cfg.alpha:
        return {**out, "verdict": "inconclusive",
                "note": f"ratio {ratio:.3f} but p={p:.2g} >= {cfg.alpha:g}: too noisy, rerun with more samples"}
    fmt = "/".join
    rounds_note = (f"round medians {fmt(f'{m:.3g}' for m in base_medians)} -> "
                   f"{fmt(f'{m:.3g}' for m in new_medians)} ms")
    if np.isfinite(round_p):
        # the rounds must move the same way as the pooled median (the t-test is two-sided)
        same_way = (np.mean(np.log(new_medians)) > np.mean(np.log(base_medians))) == (ratio > 1)
        if round_p >= cfg.round_alpha or not same_way:
            return {**out, "verdict": "inconclusive",
                    "note": f"ratio {ratio:.3f} but not across rounds ({rounds_note}, p={round_p:.2g}"
                            f"{'' if same_way else ', the other way'}): conditions changed during a run; rerun"}
        note = ""
    elif min(len(base_medians), len(new_medians)) < 2:
        note = "one round in a run: a transient during it cannot be told apart"
    else:
        note = f"no round test: a round median is not positive ({rounds_note})"
    return {**out, "verdict": "slower" if ratio > 1 else "faster", "note": note}


def _truthy(value) -> bool:
    return value is True or (isinstance(value, (str, np.bool_, bool)) and str(value).lower() == "true")


def correctness_change(base: pd.Series, new: pd.Series, cfg: CompareConfig = CompareConfig()) -> tuple[str, str]:
    """('worse' | 'lost' | 'better' | 'same', why) for one key present in both runs."""
    b, n = base.get("status"), new.get("status")
    notes, worse = [], False
    if n in BAD and b not in BAD:
        worse = True
        notes.append(f"{b}->{n}: {new.get('reason', '')}".rstrip(": "))
    if _truthy(new.get("nonfinite")) and not _truthy(base.get("nonfinite")):
        worse = True
        notes.append("new non-finite values (NaN/inf)")
    b_ratio, n_ratio = pd.to_numeric(base.get("err_ratio"), errors="coerce"), pd.to_numeric(new.get("err_ratio"),
                                                                                                 errors="coerce")
    if np.isfinite(b_ratio) and np.isfinite(n_ratio) and n_ratio - b_ratio >= cfg.err_growth:
        worse = True
        notes.append(f"err_ratio {b_ratio:.3g}->{n_ratio:.3g} (+{n_ratio - b_ratio:.2f} of the tolerance)")
    if worse:
        return "worse", "; ".join(notes)
    if b == "pass" and n in MISSING:
        return "lost", f"pass->{n}: {new.get('reason', '')}".rstrip(": ")
    if b in BAD and n == "pass":
        return "better", f"{b}->pass"
    return "same", ""


def _read_env(run_dir: Path) -> dict:
    path = run_dir / "env.json"
    return json.loads(path.read_text()) if path.exists() else {}


def run_testbed(run_dir: Path, results: pd.DataFrame) -> str | None:
    """The testbed id of a run: env.json's, else the one its rows carry (several joined by '+')."""
    env_id = _read_env(run_dir).get("testbed_id")
    if env_id:
        return str(env_id)
    ids = sorted(set(results.get("testbed_id", pd.Series(dtype=str)).dropna().astype(str)))
    return "+".join(ids) or None


def _mismatch_message(base_dir: Path, new_dir: Path, base_id, new_id) -> str:
    base_env, new_env = _read_env(base_dir), _read_env(new_dir)
    fields = ("device_name", "compute_capability", "sm_count", "memory_bytes", "cpu_model", "threads",
              "tf32_matmul", "tf32_cudnn", "device_type")
    diffs = [f"{f}: {base_env.get(f)!r} vs {new_env.get(f)!r}" for f in fields if base_env.get(f) != new_env.get(f)]
    return (f"runs are from different testbeds (base {base_id!r}, new {new_id!r})"
            + (f"; differing: {'; '.join(diffs)}" if diffs else "")
            + ". Timings across testbeds are no regression gate; pass --cross-device (cross_device=True) "
              "for a cross-device comparison report")


def _samples_by_key(run_dir: Path) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """key -> (latencies in ms, their round labels)."""
    samples = load_samples(run_dir)
    if samples.empty:
        return {}
    return {key: (g["latency_ms"].to_numpy(float), g["round"].to_numpy(int))
            for key, g in samples.groupby(list(KEY), sort=False)}


def compare_runs(base_dir: str | Path, new_dir: str | Path, *, min_effect: float = MIN_EFFECT, alpha: float = ALPHA,
                 abs_floor_ms: float = ABS_FLOOR_MS, err_growth: float = ERR_GROWTH,
                 min_samples: int = MIN_SAMPLES, round_alpha: float = ROUND_ALPHA,
                 cross_device: bool = False) -> pd.DataFrame:
    """One row per (case_id, backend, phase) of either run, with the timing verdict, the correctness change
    and `regression` (True: slower, or correctness worse/lost; always False in a cross-device report).

    Raises MismatchedTestbeds when the testbeds differ and not `cross_device`. `df.attrs` holds the mode
    ('gate' or 'cross-device'), both run dirs and testbed ids, the thresholds, and `warnings` about runs
    whose machine was busy or throttled (see run_warnings).
    """
    cfg = CompareConfig(min_effect, alpha, abs_floor_ms, err_growth, min_samples, round_alpha)
    base_dir, new_dir = Path(base_dir), Path(new_dir)
    base, new = load_results(base_dir), load_results(new_dir)
    base_id, new_id = run_testbed(base_dir, base), run_testbed(new_dir, new)
    same_testbed = base_id is not None and base_id == new_id
    if not same_testbed and not cross_device:
        raise MismatchedTestbeds(_mismatch_message(base_dir, new_dir, base_id, new_id))
    mode = "gate" if same_testbed else "cross-device"

    base_samples, new_samples = _samples_by_key(base_dir), _samples_by_key(new_dir)
    merged = base.merge(new, on=list(KEY), how="outer", suffixes=("_base", "_new"), indicator=True, sort=False)
    rows = []
    for _, row in merged.iterrows():
        key = tuple(row[k] for k in KEY)
        b = pd.Series({c[:-5]: row[c] for c in merged.columns if c.endswith("_base")})
        n = pd.Series({c[:-4]: row[c] for c in merged.columns if c.endswith("_new")})
        out = {**dict(zip(KEY, key)), "status_base": b.get("status"), "status_new": n.get("status"),
               "err_ratio_base": b.get("err_ratio"), "err_ratio_new": n.get("err_ratio")}
        if row["_merge"] != "both":
            only = "base-only" if row["_merge"] == "left_only" else "new-only"
            out.update(n_base=0, n_new=0, verdict=only, correctness="", note=f"row only in the {only[:-5]} run")
        else:
            (b_ms, b_rounds), (n_ms, n_rounds) = (base_samples.get(key, ([], [])), new_samples.get(key, ([], [])))
            timing = timing_verdict(b_ms, n_ms, cfg, base_rounds=b_rounds, new_rounds=n_rounds)
            correctness, why = correctness_change(b, n, cfg)
            note = "; ".join(filter(None, [why, timing.pop("note")]))
            out.update(timing, correctness=correctness, note=note)
        rows.append(out)
    columns = [*KEY, "verdict", "correctness", "regression", "base_ms", "new_ms", "ratio", "p_value", "round_p",
               "n_base", "n_new", "rounds_base", "rounds_new", "status_base", "status_new", "err_ratio_base",
               "err_ratio_new", "note"]
    df = pd.DataFrame(rows).reindex(columns=columns)
    gate = mode == "gate"
    df["regression"] = gate & ((df.verdict == "slower") | df.correctness.isin(["worse", "lost"]))
    df.attrs.update(mode=mode, base_dir=str(base_dir), new_dir=str(new_dir), base_testbed=base_id,
                    new_testbed=new_id, base_device=_read_env(base_dir).get("device_name"),
                    new_device=_read_env(new_dir).get("device_name"), min_effect=cfg.min_effect, alpha=cfg.alpha,
                    abs_floor_ms=cfg.abs_floor_ms, err_growth=cfg.err_growth, min_samples=cfg.min_samples,
                    round_alpha=cfg.round_alpha,
                    warnings=[f"{name} run: {w}" for name, d in (("base", base_dir), ("new", new_dir))
                              for w in run_warnings(_read_env(d))])
    return df


def run_warnings(env: dict) -> list[str]:
    """Why a run's timings may not reflect its testbed: a busy host, or a GPU throttled, at start or end."""
    out = []
    cpus = env.get("cpu_count") or 1
    for when in ("clocks_start", "clocks_end"):
        snap = env.get(when) or {}
        load = (snap.get("loadavg") or [None])[0]
        if load is not None and load > BUSY_LOAD_PER_CPU * cpus:
            out.append(f"{when[7:]}: load average {load:.1f} on {cpus} CPUs (other processes competed for them)")
        reasons = snap.get("throttle_reasons")
        # 0x0 none, 0x1 GPU idle: anything else (power cap, thermal, sync boost...) lowered the clocks
        if reasons not in (None, "", "0x0", "0x1", "0x0000000000000000", "0x0000000000000001", "Not Active"):
            out.append(f"{when[7:]}: GPU clock throttle reasons {reasons}")
    return out


def ratio_spread(df: pd.DataFrame) -> tuple[float, float] | None:
    """(50th, 90th) percentile of |ratio - 1| over rows timed in both runs. Compare two runs of the same code
    (an A/A pair) to see the testbed's run-to-run noise, and keep min_effect above it."""
    ratios = df["ratio"].astype(float)
    dev = (ratios[np.isfinite(ratios) & (df.n_base >= df.attrs.get("min_samples", 1))
                  & (df.n_new >= df.attrs.get("min_samples", 1))] - 1).abs()
    return None if dev.empty else (float(dev.quantile(0.5)), float(dev.quantile(0.9)))


def has_regression(df: pd.DataFrame) -> bool:
    """True when any row regressed (never in a cross-device report)."""
    return bool(df["regression"].any())
