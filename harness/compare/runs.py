"""Comparing two runs key by key: the testbed check, one decision per key, and the gate's exit code."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from harness.compare.decision import correctness_change
from harness.history.noise import NoiseModel
from harness.measure.paired import BUSY_LOAD_PER_CPU
from harness.measure.pooled import ALL_PHASES
from harness.measure.stats import GateConfig, family_confidence, gate_verdict
from harness.store.load import load_results, load_samples, refused_rows
from harness.store.run_dir import RESULTS, read_env
from harness.store.run_state import run_notes
from harness.store.schema import KEY, LOST, MISSING, NEW_ONLY, REJECTED, SLOWER, UNDECIDED, WORSE

COMPARE_COLUMNS = (*KEY, "verdict", "correctness", "regression", "base_ms", "new_ms", "ratio", "ratio_low",
                   "ratio_high", "margin", "n_base", "n_new", "rounds_base", "rounds_new", "remeasured",
                   "first_verdict", "status_base", "status_new", "err_ratio_base", "err_ratio_new", "note")
#: compare's exit codes: 2 is bad input (the CLI's), so undecided keys get their own
EXIT_OK, EXIT_REGRESSION, EXIT_UNDECIDED = 0, 1, 3


class MismatchedTestbeds(ValueError):
    """The two runs come from different testbeds, so their timings are no regression gate."""


@dataclass(frozen=True)
class RunSide:
    """One side of a comparison: its run directory, testbed and device."""

    run_dir: Path
    testbed: str | None
    device_name: str | None


@dataclass
class Comparison:
    """Two runs compared key by key; mode: 'gate' (same testbed) or 'cross-device' (a report, never a gate)."""

    rows: pd.DataFrame
    mode: str
    base: RunSide
    new: RunSide
    config: GateConfig
    warnings: list[str] = field(default_factory=list)
    noise: NoiseModel | None = None
    #: keys missing from the new run do not fail the gate (a deliberate subset)
    allow_missing: bool = False
    #: what a reader must know of either run (store.run_state): it did not reach its end, lines were refused
    notes: list[str] = field(default_factory=list)
    #: each key's interval confidence: config.confidence raised to the family-wise level over the keys timed in both
    key_confidence: float = 0.0
    #: after `compare --remeasure` left keys undecided: the next step it has not taken (the budget a decision would
    #: need, a quieter machine, fewer keys), in words; '' when it did not run or decided every key
    remeasure_next: str = ""
    #: after a paired `compare --remeasure`: one row per backend (and per backend and phase) with its verdict over
    #: its keys (compare/groups.py); None when none was made
    groups: pd.DataFrame | None = None

    @property
    def slower_groups(self) -> pd.DataFrame:
        """The backends (or their phases) slower as a whole: each fails the gate like a slower key."""
        if self.groups is None or self.mode != "gate":
            return pd.DataFrame()
        return self.groups[self.groups.verdict == SLOWER]

    @property
    def regression(self) -> bool:
        """True when any key regressed, a backend got slower as a whole, or (unless allow_missing) the new run lost
        keys; never cross-device."""
        return bool(self.rows["regression"].any()) or not self.slower_groups.empty

    @property
    def undecided(self) -> pd.DataFrame:
        return self.rows[self.rows.verdict == UNDECIDED] if self.mode == "gate" else self.rows.iloc[:0]

    def exit_code(self, fail_on_undecided: bool = True) -> int:
        """1 on a regression (or lost keys), else 3 when undecided keys remain and they fail the gate, else 0."""
        return (EXIT_REGRESSION if self.regression else
                EXIT_UNDECIDED if fail_on_undecided and len(self.undecided) else EXIT_OK)


def run_testbed(run_dir: Path, results: pd.DataFrame) -> str | None:
    """The testbed id of a run: env.json's, else the one its rows carry (several joined by '+')."""
    env_id = read_env(run_dir).get("testbed_id")
    if env_id:
        return str(env_id)
    ids = sorted(set(results.get("testbed_id", pd.Series(dtype=str)).dropna().astype(str)))
    return "+".join(ids) or None


def _mismatch_message(base_dir: Path, new_dir: Path, base_id, new_id) -> str:
    base_env, new_env = read_env(base_dir), read_env(new_dir)
    fields = ("device_name", "compute_capability", "sm_count", "memory_bytes", "cpu_model", "threads",
              "tf32_matmul", "tf32_cudnn", "device_type")
    diffs = [f"{f}: {base_env.get(f)!r} vs {new_env.get(f)!r}" for f in fields if base_env.get(f) != new_env.get(f)]
    return (f"runs are from different testbeds (base {base_id!r}, new {new_id!r})"
            + (f"; differing: {'; '.join(diffs)}" if diffs else "")
            + ". Timings across testbeds are no regression gate; pass --cross-device (cross_device=True) "
              "for a cross-device comparison report")


def samples_by_key(run_dir: Path) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """key -> (latencies in ms, their round labels)."""
    samples = load_samples(run_dir)
    if samples.empty:
        return {}
    return {key: (g["latency_ms"].to_numpy(float), g["round"].to_numpy(int))
            for key, g in samples.groupby(list(KEY), sort=False)}


def compare_runs(base_dir: str | Path, new_dir: str | Path, config: GateConfig = GateConfig(), *,
                 cross_device: bool = False, noise: NoiseModel | None = None, allow_missing: bool = False,
                 use_noise_model: bool = True) -> Comparison:
    """One row per key of either run with its timing verdict, correctness change and `regression`; `noise`
    (default: the model beside the base run, when `use_noise_model`) sets each key's margin. Raises
    MismatchedTestbeds when the testbeds differ and not `cross_device`."""
    base_dir, new_dir = Path(base_dir), Path(new_dir)
    base, new = load_results(base_dir), load_results(new_dir)
    base_id, new_id = run_testbed(base_dir, base), run_testbed(new_dir, new)
    same_testbed = base_id is not None and base_id == new_id
    if not same_testbed and not cross_device:
        raise MismatchedTestbeds(_mismatch_message(base_dir, new_dir, base_id, new_id))
    mode = "gate" if same_testbed else "cross-device"
    if noise is None and use_noise_model and mode == "gate":
        noise = NoiseModel.for_run(base_dir, base_id)

    base_env, new_env = read_env(base_dir), read_env(new_dir)
    # a run made under load timed the machine as much as the code: its slower keys wait for --remeasure's pairs
    loaded = "; ".join(f"{name} run {w}" for name, env in (("base", base_env), ("new", new_env))
                       for w in busy_load(env))
    base_samples, new_samples = samples_by_key(base_dir), samples_by_key(new_dir)
    # every timed key is a test: at 90 % each, 73 keys of unchanged code gave a false 'slower' most pairs (issue 48)
    # (the gate's; a cross-device comparison is a report of each key)
    timed_keys = len(base_samples.keys() & new_samples.keys()) if mode == "gate" else 1
    key_config = replace(config, confidence=family_confidence(config.confidence, timed_keys))
    same_inputs = base_env.get("seed", 0) == new_env.get("seed", 0)  # a run without a seed recorded used 0
    merged = base.copy().merge(new.copy(), on=list(KEY), how="outer", suffixes=("_base", "_new"), indicator=True,
                               sort=False)  # copies: an empty run comes back column by column (fragmented)
    rows = []
    for _, row in merged.iterrows():
        key = tuple(row[k] for k in KEY)
        b = pd.Series({c[:-5]: row[c] for c in merged.columns if c.endswith("_base")})
        n = pd.Series({c[:-4]: row[c] for c in merged.columns if c.endswith("_new")})
        out = {**dict(zip(KEY, key)), "status_base": b.get("status"), "status_new": n.get("status"),
               "err_ratio_base": b.get("err_ratio"), "err_ratio_new": n.get("err_ratio"), "remeasured": False,
               "first_verdict": ""}
        if row["_merge"] == "left_only":
            out.update(n_base=0, n_new=0, verdict=MISSING, correctness="",
                       note="in the base run, not in the new one" + (" (allowed)" if allow_missing else ""))
        elif row["_merge"] == "right_only":
            out.update(n_base=0, n_new=0, verdict=NEW_ONLY, correctness="", note="only in the new run")
        else:
            (b_ms, b_rounds), (n_ms, n_rounds) = base_samples.get(key, ([], [])), new_samples.get(key, ([], []))
            timing = gate_verdict(b_ms, n_ms, key_config, base_rounds=b_rounds, new_rounds=n_rounds,
                                  noise=None if noise is None else noise.key(key), loaded=loaded)
            correctness, why = correctness_change(b, n, config, same_inputs)
            out.update(timing.columns(), verdict=timing.verdict, correctness=correctness,
                       note="; ".join(filter(None, [why, timing.note])))
        rows.append(out)
    df = pd.DataFrame(rows).reindex(columns=list(COMPARE_COLUMNS))
    warnings = [f"{name} run: {w}" for name, env in (("base", base_env), ("new", new_env)) for w in run_warnings(env)]
    if new.empty:
        warnings.append("the new run has no rows: it crashed, was killed before its first case, or ran nothing")
    comparison = Comparison(df, mode, RunSide(base_dir, base_id, base_env.get("device_name")),
                            RunSide(new_dir, new_id, new_env.get("device_name")), config, warnings, noise,
                            allow_missing, key_confidence=key_config.confidence)
    comparison.notes = [f"{name} run: {note}" for name, env, df in (("base", base_env, base), ("new", new_env, new))
                        for note in run_notes(env, {RESULTS: refused_rows(df)})]
    mark_regressions(comparison)
    return comparison


def mark_regressions(comparison: Comparison) -> None:
    """Set the rows' `regression` (gate only): slower, rejected, correctness worse or lost, missing (unless allowed),
    and a key of a backend (or phase) slower as a whole whose own ratio lies beyond its margin."""
    df = comparison.rows
    missing = (df.verdict == MISSING) & (not comparison.allow_missing)
    in_slower = pd.Series(False, index=df.index)
    for g in comparison.slower_groups.itertuples():
        in_slower |= (df.backend == g.backend) & ((g.phase == ALL_PHASES) | (df.phase == g.phase)) & \
            (df.remeasured.astype(bool)) & (df.ratio.astype(float) > df.margin.astype(float))
    df["regression"] = (comparison.mode == "gate") & (df.verdict.isin([SLOWER, REJECTED]) | in_slower
                                                      | df.correctness.isin([WORSE, LOST]) | missing)


def busy_load(env: dict) -> list[str]:
    """When a run's 1-minute load average (at its start or end) exceeded BUSY_LOAD_PER_CPU per CPU, and by how much."""
    cpus = env.get("cpu_count") or 1
    loads = {when[7:]: ((env.get(when) or {}).get("loadavg") or [None])[0] for when in ("clocks_start", "clocks_end")}
    return [f"{when}: load average {load:.1f} on {cpus} CPUs" for when, load in loads.items()
            if isinstance(load, (int, float)) and load > BUSY_LOAD_PER_CPU * cpus]


def run_warnings(env: dict) -> list[str]:
    """Why a run's timings may not reflect its testbed: a busy host, or a GPU throttled, at start or end."""
    throttles = {when[7:]: (env.get(when) or {}).get("throttle_reasons") for when in ("clocks_start", "clocks_end")}
    # 0x0 none, 0x1 GPU idle: anything else (power cap, thermal, sync boost...) lowered the clocks
    quiet = (None, "", "0x0", "0x1", "0x0000000000000000", "0x0000000000000001", "Not Active")
    return [*(f"{w} (other processes competed for them)" for w in busy_load(env)),
            *(f"{when}: GPU clock throttle reasons {r}" for when, r in throttles.items() if r not in quiet)]


def ratio_spread(comparison: Comparison) -> tuple[float, float] | None:
    """(50th, 90th) percentile of |ratio - 1| over rows timed in both runs: of an A/A pair, the testbed's noise."""
    ratios = comparison.rows["ratio"].astype(float)
    dev = (ratios[np.isfinite(ratios)] - 1).abs()
    return None if dev.empty else (float(dev.quantile(0.5)), float(dev.quantile(0.9)))
