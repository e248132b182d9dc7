"""A stored run loaded for plots and reports: filtered rows with the columns they group by, speedups, the env."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness.measure.fidelity import FIDELITY_TAG
from harness.cases.case import dtype_name, parse_dtype
from harness.store.load import load_results, load_samples, refused_rows
from harness.store.run_dir import RESULTS, SAMPLES, read_env
from harness.store.schema import BASELINE, COLUMNS, KEY, OBSERVED, VERDICT_PHASES

SEMANTICS_PREFIX = "semantics:"
NUMERIC = ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim", "err_ratio", "latency_ms", "latency_iqr_ms",
           "latency_min_ms", "n_samples", "threads", "peak_mem_bytes", "flops", "tflops", "pct_of_peak",
           "compile_ms", "rounds", "round_spread", "bytes_moved", "gbps", "pct_of_bw_peak")
#: a line of a "vs sequence length" plot: cases that differ only in sequence length
GROUP_KEYS = ("suite", "dtype", "head_dim", "mask_kind", "modifier_kind", "batch", "heads", "kv_heads", "seq_shape")


@dataclass
class Run:
    """A run's stored results (filtered, with derived columns) and its environment."""

    run_dir: Path
    df: pd.DataFrame
    env: dict
    baseline: str
    filters: dict = field(default_factory=dict)
    #: lines of the run's files the loader refused, by file name (results.csv, samples.csv)
    refused: dict = field(default_factory=dict)

    @property
    def cases(self) -> pd.DataFrame:
        """Rows of real attention cases (semantics observations excluded)."""
        return self.df[~self.df.is_semantics]

    @property
    def semantics(self) -> pd.DataFrame:
        """Observations of how backends behave (the timing-fidelity row is not one)."""
        return self.df[self.df.is_semantics & ~self.df.is_fidelity]

    @property
    def fidelity(self) -> pd.DataFrame:
        """The timing-fidelity rows: the harness's timer against an independent one."""
        return self.df[self.df.is_fidelity]

    @property
    def verdicts(self) -> pd.DataFrame:
        """Case rows carrying a correctness verdict: fwd and bwd, and any phase of a tagged suite (edge:, ...)."""
        cases = self.cases
        return cases[cases.phase.isin(VERDICT_PHASES) | (cases.suite != "")]

    @property
    def backends(self) -> list[str]:
        return list(dict.fromkeys(self.df.backend))

    @property
    def has_perf(self) -> bool:
        return bool(np.isfinite(self.df.latency_ms).any())

    @property
    def has_baseline(self) -> bool:
        return bool(np.isfinite(self.df.speedup).any())


def mask_kind(mask_id: object) -> str:
    """'window50-0' -> 'window', 'causal+keypad101_152' -> 'causal+keypad', 'docs-causal3_2x4_1' -> 'docs-causal':
    the mask family, not its sizes."""
    if not isinstance(mask_id, str) or not mask_id:
        return "none" if mask_id is None or (isinstance(mask_id, float) and math.isnan(mask_id)) else str(mask_id)
    # ids append shape-derived sizes to the family name; dropping them lets one family span sequence lengths
    return "+".join(re.sub(r"-?\d.*$", "", part) or part for part in mask_id.split("+"))


def modifier_kind(modifier_id: object) -> str:
    """'cap30-sink' -> 'cap-sink', 'headbias' -> 'headbias', '' or NaN (results from before the modifiers) -> 'none':
    the modifier family, not its values, plus 'v' when the value head dim differs (set by `_read`)."""
    if not isinstance(modifier_id, str) or not modifier_id:
        return "none"
    return "-".join(re.sub(r"\d.*$", "", part) or part for part in modifier_id.split("-"))


def seq_shape(seq_q: float, seq_k: float) -> str:
    """Which sequence-length family a case belongs to, so x = seq_k determines seq_q along a line."""
    if not (np.isfinite(seq_q) and np.isfinite(seq_k)):
        return "n/a"
    if seq_q == seq_k:
        return "seq_q = seq_k"
    if seq_q == 1:
        return "decode (seq_q = 1)"
    if seq_k == 0:  # empty-tensor probes
        return "seq_k = 0"
    return f"seq_q/seq_k = {seq_q / seq_k:.2g}"


def truthy(series: pd.Series) -> pd.Series:
    """CSV booleans ('True', 1, true) as bool; empty is False."""
    return series.map(lambda v: str(v).strip().lower() in ("true", "1", "1.0", "yes"))


def peak_tflops(env: dict, dtype: str) -> float | None:
    """The run's measured dense-matmul peak for `dtype` (TFLOP/s), from env.json, or None."""
    value = (env.get("matmul_peak_tflops") or {}).get(dtype)  # keyed by spec.case.dtype_name, as rows' dtype
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def load_run(run_dir: str | Path, *, baseline: str = BASELINE, backends: list[str] | None = None,
             dtype: str | None = None, mask: str | None = None, strict_baseline: bool = False) -> Run:
    """Read results.csv, samples.csv and env.json of `run_dir`, apply the filters (values present in the run, else a
    ValueError naming it; the baseline's rows stay under a backend filter: speedups need them), add derived columns."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run directory at {run_dir}")
    df, refused = _read(run_dir)
    df, filters = _filter(df, baseline, backends, dtype, mask, strict_baseline)
    run = Run(run_dir, df.reset_index(drop=True), read_env(run_dir), baseline, filters)
    _derive_perf(run)
    quartiles, refused_samples = _quartiles(run_dir)
    run.df = unsettled(run.df.merge(quartiles, on=list(KEY), how="left"))
    run.refused = {name: n for name, n in ((RESULTS, refused), (SAMPLES, refused_samples)) if n}
    return run


def unsettled(df: pd.DataFrame) -> pd.DataFrame:
    """`noisy_matters`: a noisy row (IQR or round spread over 10 % of the median) whose samples' quartiles overlap
    another backend's on the same case and phase - the order there is not settled by the samples. The figures ring
    only these: a noisy point far from every other changes no conclusion (issue 67: rings on almost every point said
    nothing)."""
    df = df.copy()
    df["noisy_matters"] = False
    if "latency_q1_ms" not in df or not df.noisy.any():
        return df
    low, high = df.latency_q1_ms.fillna(df.latency_ms), df.latency_q3_ms.fillna(df.latency_ms)
    for _, g in df[df.latency_ms.notna()].groupby(["case_id", "phase"], sort=False):
        if len(g) < 2:
            continue
        for i in g.index[g.noisy.to_numpy(bool)]:
            others = g.index[g.backend != df.at[i, "backend"]]
            df.at[i, "noisy_matters"] = bool(((low[others] <= high[i]) & (high[others] >= low[i])).any())
    return df


def _read(run_dir: Path) -> tuple[pd.DataFrame, int]:
    """The folded results with every schema column, numbers as floats, and the columns plots group by; and how
    many lines of results.csv were refused."""
    df = load_results(run_dir)
    refused = refused_rows(df)
    df = df.reindex(columns=list(dict.fromkeys([*COLUMNS, *df.columns])))
    for col in NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    df["status"] = df.status.fillna("").astype(str)
    df["phase"] = df.phase.fillna("").astype(str)
    # observations, not attention cases: semantics answers, probe findings and the timing-fidelity row
    df["is_semantics"] = (df.status == OBSERVED) | df.case_id.astype(str).str.startswith(SEMANTICS_PREFIX)
    # the fidelity row measures the timer, not a backend's convention: shown with the environment instead
    df["is_fidelity"] = df.case_id.astype(str).str.startswith(FIDELITY_TAG + ":")
    df["mask_kind"] = df["mask"].map(mask_kind)
    df["head_dim_v"] = pd.to_numeric(df["head_dim_v"], errors="coerce").fillna(df["head_dim"])
    df["modifier_kind"] = [f"{kind}+dv{dv:g}".removeprefix("none+") if np.isfinite(dv) and dv != d else kind
                           for kind, d, dv in zip(df["modifiers"].map(modifier_kind), df["head_dim"], df["head_dim_v"])]
    # 'edge:empty-b0:fp32-...' -> 'edge': rows of a tagged suite never share a line or a winner with the matrix
    df["suite"] = df.case_id.astype(str).map(lambda c: c.split(":", 1)[0] if ":" in c else "")
    df["seq_shape"] = [seq_shape(q, k) for q, k in zip(df.seq_q, df.seq_k)]
    df["noisy"], df["suspicious"] = truthy(df.noisy), truthy(df.suspicious)
    return df, refused


def _filter(df: pd.DataFrame, baseline: str, backends: list[str] | None, dtype: str | None,
            mask: str | None, strict_baseline: bool) -> tuple[pd.DataFrame, dict]:
    """Rows kept by the filters (dtype and mask apply to attention cases, not semantics rows), and a summary."""
    filters: dict = {}
    present = list(dict.fromkeys(df.backend))
    if strict_baseline and baseline not in present:
        raise ValueError(f"baseline {baseline!r} is not in this run; present: {', '.join(present)}")
    if backends:
        unknown = [b for b in backends if b not in present]
        if unknown:
            raise ValueError(f"backend {unknown[0]!r} is not in this run; present: {', '.join(present)}")
        df = df[df.backend.isin([*backends, baseline])]
        filters["backends"] = ",".join(backends)
    if dtype:
        cases = ~df.is_semantics
        try:  # the canonical short name ('bfloat16' -> 'bf16'), or the name itself when it is none
            wanted = dtype_name(parse_dtype(dtype))
        except ValueError:
            wanted = dtype
        dtypes = sorted(df.loc[cases, "dtype"].dropna().astype(str).unique())
        if wanted not in dtypes:
            raise ValueError(f"dtype {dtype!r} is not in this run; present: {', '.join(dtypes)}")
        df = df[~cases | (df.dtype == wanted)]
        filters["dtype"] = wanted
    if mask:
        cases = ~df.is_semantics
        kinds = sorted(set(df.loc[cases, "mask_kind"]) | set(df.loc[cases, "mask"].dropna().astype(str)))
        if mask not in kinds:
            raise ValueError(f"mask {mask!r} is not in this run; present: {', '.join(kinds)}")
        df = df[~cases | (df.mask_kind == mask) | (df["mask"] == mask)]
        filters["mask"] = mask
    return df, filters


def _quartiles(run_dir: Path) -> tuple[pd.DataFrame, int]:
    """25th and 75th percentile of each key's raw timing samples (the IQR's ends, which the CSV does not keep),
    and how many lines of samples.csv were refused."""
    samples = load_samples(run_dir)
    refused = refused_rows(samples)
    if samples.empty:
        return pd.DataFrame({**{k: pd.Series(dtype=object) for k in KEY},
                             "latency_q1_ms": pd.Series(dtype=float), "latency_q3_ms": pd.Series(dtype=float)}), refused
    q = samples.groupby(list(KEY)).latency_ms.quantile([0.25, 0.75]).unstack()  # linear, as np.percentile
    return q.set_axis(["latency_q1_ms", "latency_q3_ms"], axis=1).reset_index(), refused


def _derive_perf(run: Run) -> None:
    """Speedup and memory relative to the baseline (same case and phase); TFLOP/s and % of peak when absent."""
    df = run.df
    base = df[(df.backend == run.baseline) & ~df.is_semantics][["case_id", "phase", "latency_ms", "peak_mem_bytes",
                                                                "suspicious"]]
    base = base.rename(columns={"latency_ms": "base_latency_ms", "peak_mem_bytes": "base_peak_mem_bytes",
                                "suspicious": "base_suspicious"})
    df = df.merge(base, on=["case_id", "phase"], how="left")
    # a figure beyond the measured peak, on either side, is no speedup (schema.figures_comparable)
    comparable = ~df.suspicious & ~df.base_suspicious.astype("boolean").fillna(False).astype(bool)
    df["speedup"] = (df.base_latency_ms / df.latency_ms).where(comparable)
    df = df.drop(columns="base_suspicious")
    df["mem_vs_base"] = df.peak_mem_bytes / df.base_peak_mem_bytes
    df["peak_mem_mib"] = df.peak_mem_bytes / 2**20
    # the benchmark stage fills tflops/pct_of_peak; derive them only from stored figures when it did not
    df["tflops"] = df.tflops.where(np.isfinite(df.tflops), df.flops / (df.latency_ms * 1e-3) / 1e12)
    peaks = df.dtype.map(lambda d: peak_tflops(run.env, str(d)) or np.nan).astype(float)
    df["pct_of_peak"] = df.pct_of_peak.where(np.isfinite(df.pct_of_peak), 100 * df.tflops / peaks)
    run.df = df
