"""Derived views of one stored run for plots and reports: filters, shape groups, speedups, support, winners."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness.results import COLUMNS, KEY, PHASES, load_results, load_samples

#: statuses that mean the backend ran and got it wrong (or died trying)
BAD = ("fail", "error", "oom")
#: phases that carry a correctness verdict; a main-matrix fwd+bwd row exists only for timing and repeats them
VERDICT_PHASES = ("fwd", "bwd")
SEMANTICS_PREFIX = "semantics:"
NOT_ANSWERED = ("unavailable", "unsupported")  # semantics cells of a backend that could not take the question
NUMERIC = ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim", "err_ratio", "latency_ms", "latency_iqr_ms",
           "latency_min_ms", "n_samples", "threads", "peak_mem_bytes", "flops", "tflops", "pct_of_peak",
           "compile_ms", "rounds", "round_spread")
#: a line of a "vs sequence length" plot: cases that differ only in sequence length
GROUP_KEYS = ("suite", "dtype", "head_dim", "mask_kind", "batch", "heads", "kv_heads", "seq_shape")


@dataclass
class Run:
    """A run's stored results (filtered, with derived columns) and its environment."""

    run_dir: Path
    df: pd.DataFrame
    env: dict
    baseline: str
    filters: dict = field(default_factory=dict)

    @property
    def cases(self) -> pd.DataFrame:
        """Rows of real attention cases (semantics observations excluded)."""
        return self.df[~self.df.is_semantics]

    @property
    def semantics(self) -> pd.DataFrame:
        return self.df[self.df.is_semantics]

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


def load_env(run_dir: Path) -> dict:
    path = run_dir / "env.json"
    return json.loads(path.read_text()) if path.exists() else {}


def peak_tflops(env: dict, dtype: str) -> float | None:
    """The run's measured dense-matmul peak for `dtype` (TFLOP/s), from env.json, or None."""
    peaks = env.get("matmul_peak_tflops") or {}
    aliases = {"fp32": ("float32", "torch.float32"), "fp16": ("float16", "half", "torch.float16"),
               "bf16": ("bfloat16", "torch.bfloat16"), "fp64": ("float64", "torch.float64")}
    for key in (dtype, *aliases.get(dtype, ())):
        value = peaks.get(key)
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    return None


def load_run(run_dir: str | Path, *, baseline: str = "naive", backends: list[str] | None = None,
             dtype: str | None = None, mask: str | None = None, strict_baseline: bool = False) -> Run:
    """Read results.csv, samples.csv and env.json of `run_dir`, apply the filters, add derived columns.

    Filters name values present in the run; anything else is a ValueError naming it. The baseline's rows are
    kept under a backend filter because every speedup is measured against them.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run directory at {run_dir}")
    df = _read(run_dir)
    present = list(dict.fromkeys(df.backend))
    if strict_baseline and baseline not in present:
        raise ValueError(f"baseline {baseline!r} is not in this run; present: {', '.join(present)}")
    df, filters = _filter(df, baseline, backends, dtype, mask)
    run = Run(run_dir, df.reset_index(drop=True), load_env(run_dir), baseline, filters)
    _derive_perf(run)
    run.df = run.df.merge(_quartiles(run_dir), on=list(KEY), how="left")
    return run


def _read(run_dir: Path) -> pd.DataFrame:
    """The folded results with every schema column, numbers as floats, and the columns plots group by."""
    df = load_results(run_dir)
    df = _observed_verbatim(df.reindex(columns=list(dict.fromkeys([*COLUMNS, *df.columns]))), run_dir)
    for col in NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    df["status"] = df.status.fillna("").astype(str)
    df["phase"] = df.phase.fillna("").astype(str)
    df["is_semantics"] = (df.status == "observed") | df.case_id.astype(str).str.startswith(SEMANTICS_PREFIX)
    df["mask_kind"] = df["mask"].map(mask_kind)
    # 'edge:empty-b0:fp32-...' -> 'edge': rows of a tagged suite never share a line or a winner with the matrix
    df["suite"] = df.case_id.astype(str).map(lambda c: c.split(":", 1)[0] if ":" in c else "")
    df["seq_shape"] = [seq_shape(q, k) for q, k in zip(df.seq_q, df.seq_k)]
    df["noisy"], df["suspicious"] = truthy(df.noisy), truthy(df.suspicious)
    return df


def _filter(df: pd.DataFrame, baseline: str, backends: list[str] | None, dtype: str | None,
            mask: str | None) -> tuple[pd.DataFrame, dict]:
    """Rows kept by the filters (dtype and mask apply to attention cases, not semantics rows), and a summary."""
    filters: dict = {}
    if backends:
        present = list(dict.fromkeys(df.backend))
        unknown = [b for b in backends if b not in present]
        if unknown:
            raise ValueError(f"backend {unknown[0]!r} is not in this run; present: {', '.join(present)}")
        df = df[df.backend.isin([*backends, baseline])]
        filters["backends"] = ",".join(backends)
    if dtype:
        cases = ~df.is_semantics
        wanted = _dtype_key(dtype)
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


def _quartiles(run_dir: Path) -> pd.DataFrame:
    """25th and 75th percentile of each key's raw timing samples (the IQR's ends, which the CSV does not keep)."""
    samples = load_samples(run_dir)
    if samples.empty:
        return pd.DataFrame({**{k: pd.Series(dtype=object) for k in KEY},
                             "latency_q1_ms": pd.Series(dtype=float), "latency_q3_ms": pd.Series(dtype=float)})
    samples = samples.assign(latency_ms=pd.to_numeric(samples.latency_ms, errors="coerce"))
    q = samples.groupby(list(KEY)).latency_ms.quantile([0.25, 0.75]).unstack()  # linear, as np.percentile
    return q.set_axis(["latency_q1_ms", "latency_q3_ms"], axis=1).reset_index()


def _observed_verbatim(df: pd.DataFrame, run_dir: Path) -> pd.DataFrame:
    """Re-read `observed` as text: an observed 'nan' or 'None' is an answer, not a missing value."""
    raw = pd.read_csv(run_dir / "results.csv", dtype=str, keep_default_na=False,
                      usecols=lambda c: c in (*KEY, "observed"))
    if "observed" not in raw or df.empty:
        return df
    raw = raw[raw.observed != ""].drop_duplicates(list(KEY), keep="last")  # fold: the last non-empty value wins
    merged = df.drop(columns="observed").merge(raw, on=list(KEY), how="left")
    return merged[df.columns]


def _dtype_key(name: str) -> str:
    from harness.case import dtype_name, parse_dtype  # canonical short names ('bfloat16' -> 'bf16')

    try:
        return dtype_name(parse_dtype(name))
    except ValueError:
        return name


def _derive_perf(run: Run) -> None:
    """Speedup and memory relative to the baseline (same case and phase); TFLOP/s and % of peak when absent."""
    df = run.df
    base = df[(df.backend == run.baseline) & ~df.is_semantics][["case_id", "phase", "latency_ms", "peak_mem_bytes"]]
    base = base.rename(columns={"latency_ms": "base_latency_ms", "peak_mem_bytes": "base_peak_mem_bytes"})
    df = df.merge(base, on=["case_id", "phase"], how="left")
    df["speedup"] = df.base_latency_ms / df.latency_ms
    df["mem_vs_base"] = df.peak_mem_bytes / df.base_peak_mem_bytes
    df["peak_mem_mib"] = df.peak_mem_bytes / 2**20
    # the benchmark stage fills tflops/pct_of_peak; derive them only from stored figures when it did not
    derived = df.flops / (df.latency_ms * 1e-3) / 1e12
    df["tflops"] = df.tflops.where(np.isfinite(df.tflops), derived)
    peaks = df.dtype.map(lambda d: peak_tflops(run.env, str(d)) or np.nan).astype(float)
    df["pct_of_peak"] = df.pct_of_peak.where(np.isfinite(df.pct_of_peak), 100 * df.tflops / peaks)
    run.df = df


def shape_groups(df: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """Case rows split into the groups whose members differ only in sequence length, in a stable order."""
    cases = df[~df.is_semantics] if "is_semantics" in df else df
    if cases.empty:
        return []
    keyed = cases.assign(**{k: cases[k].fillna(-1) if cases[k].dtype.kind == "f" else cases[k].fillna("n/a")
                            for k in GROUP_KEYS})
    return [(key, g) for key, g in keyed.groupby(list(GROUP_KEYS), sort=True, dropna=False)]


def split_series(df: pd.DataFrame) -> tuple[list[tuple[tuple, pd.DataFrame]], pd.DataFrame]:
    """(shape groups measured at two or more lengths, the rows of every other case): lines vs dots.

    A length of 0 (empty-tensor probes) has no place on a log axis: such rows are always dots.
    """
    series, singles = [], []
    for key, g in shape_groups(df):
        positive = g.seq_k > 0
        if g.seq_k[positive].nunique() >= 2:
            series.append((key, g[positive]))
            singles.append(g[~positive])
        else:
            singles.append(g)
    return series, pd.concat(singles) if singles else df.iloc[0:0]


def case_label(row: pd.Series) -> str:
    """Short axis label of a case: 'bf16 d64 causal s1x257', with 'h8kv2' when heads are grouped."""
    seq = f"{row['seq_q']:g}" if row["seq_q"] == row["seq_k"] else f"{row['seq_q']:g}x{row['seq_k']:g}"
    heads = f" h{row['heads']:g}kv{row['kv_heads']:g}" if row["kv_heads"] != row["heads"] else ""
    suite = f"{row['suite']}: " if row["suite"] else ""
    return f"{suite}{row['dtype']} d{row['head_dim']:g} {row['mask_kind']} s{seq}{heads}"


def group_label(key: tuple) -> str:
    """'bf16 · d64 · causal' and a second line 'b2 h8 kv2 · seq_q = seq_k' (suite first when tagged)."""
    suite, dtype, head_dim, kind, batch, heads, kv_heads, shape = key
    heads_txt = f"h{heads:g}" + (f" kv{kv_heads:g}" if kv_heads != heads else "")
    return f"{suite + ': ' if suite else ''}{dtype} · d{head_dim:g} · {kind}\nb{batch:g} {heads_txt} · {shape}"


def case_group(row: pd.Series) -> str:
    """Column of the support matrix a case row belongs to: its suite (if tagged), dtype and mask family."""
    dtype = row["dtype"]  # not row.dtype: that is the Series' own dtype
    return f"{row['suite'] + ': ' if row['suite'] else ''}{dtype if isinstance(dtype, str) else '?'} · {row['mask_kind']}"


def support_counts(run: Run) -> pd.DataFrame:
    """backend x case group -> {status: number of (case, phase) rows}, verdict phases only."""
    rows = run.verdicts
    if rows.empty:
        return pd.DataFrame()
    rows = rows.assign(group=rows.apply(case_group, axis=1))
    counts = rows.groupby(["backend", "group", "status"], sort=False).size()
    table = pd.DataFrame(index=list(dict.fromkeys(rows.backend)), columns=sorted(set(rows.group)), dtype=object)
    for (backend, group, status), n in counts.items():
        cell = table.at[backend, group]
        table.at[backend, group] = {**(cell if isinstance(cell, dict) else {}), status: int(n)}
    return table.map(lambda c: c if isinstance(c, dict) else {})


def semantics_table(run: Run) -> pd.DataFrame:
    """Question (case id without the prefix, plus the phase where a question has several) x backend -> observed."""
    sem = run.semantics
    if sem.empty:
        return pd.DataFrame()
    question = sem.case_id.astype(str).str.removeprefix(SEMANTICS_PREFIX)
    several = sem.groupby(question.values).phase.transform("nunique").values > 1
    question = question.where(~several, question + " [" + sem.phase + "]")
    # a question a backend could not answer (a row with another status) says so: "unavailable: <reason>"
    not_observed = sem.status + ": " + sem.reason.astype(object).fillna("").astype(str)
    value = sem.observed.where(sem.observed.notna(), not_observed.str.rstrip(": ")).astype(str)
    table = pd.DataFrame({"question": question.values, "backend": sem.backend.values, "value": value.values})
    return table.pivot_table(index="question", columns="backend", values="value", aggfunc="first", sort=False)\
        .reindex(columns=[b for b in run.backends if b in set(sem.backend)]).fillna("")  # run's backend order


def answered(value: object) -> bool:
    """Whether a semantics cell holds an observation, not 'unavailable: ...' / 'unsupported: ...' / empty."""
    return bool(str(value)) and not str(value).startswith(NOT_ANSWERED)


def short_cell(value: object) -> str:
    """A semantics cell for display: the observation, or just the status of a backend that gave none."""
    return str(value) if answered(value) else str(value).split(":")[0]


def correct_cases(run: Run) -> pd.DataFrame:
    """(case_id, backend) -> whether fwd and bwd verdicts passed (NaN phase verdict = not run)."""
    rows = run.verdicts[run.verdicts.phase.isin(VERDICT_PHASES)]
    wide = rows.pivot_table(index=["case_id", "backend"], columns="phase", values="status", aggfunc="first")
    return wide.reindex(columns=list(VERDICT_PHASES)).eq("pass")


def timed_correct(run: Run) -> pd.DataFrame:
    """Timed rows whose correctness holds for that phase (fwd+bwd needs both); the only ones worth ranking."""
    cases = run.cases[run.cases.suite == ""]  # the benchmark times the matrix; a tagged probe is not a contender
    rows = cases[np.isfinite(cases.latency_ms) & ~cases.status.isin(BAD)]
    if rows.empty:
        return rows
    ok = correct_cases(run)
    def passed(r) -> bool:
        verdict = ok.loc[(r.case_id, r.backend)] if (r.case_id, r.backend) in ok.index else None
        if verdict is None:
            return False
        return bool(verdict["fwd"] and verdict["bwd"]) if r.phase == "fwd+bwd" else bool(verdict.get(r.phase))
    return rows[rows.apply(passed, axis=1)]


def winners(run: Run) -> pd.DataFrame:
    """Fastest correct backend per shape group (dtype, head_dim, mask, batch, heads, seq_q, seq_k, phase)."""
    rows = timed_correct(run)
    if rows.empty:
        return pd.DataFrame()
    keys = ["dtype", "head_dim", "mask", "batch", "heads", "kv_heads", "seq_q", "seq_k", "phase"]
    out = []
    for key, g in rows.groupby(keys, sort=False, dropna=False):
        g = g.sort_values("latency_ms")
        best = g.iloc[0]
        second = g.iloc[1] if len(g) > 1 else None
        out.append({**dict(zip(keys, key)), "winner": best.backend, "latency_ms": best.latency_ms,
                    "suspicious": bool(best.suspicious), "noisy": bool(best.noisy),
                    "runner_up": "" if second is None else second.backend,
                    "margin": np.nan if second is None else second.latency_ms / best.latency_ms,
                    "speedup": best.speedup, "candidates": len(g)})
    order = {p: i for i, p in enumerate(PHASES)}
    table = pd.DataFrame(out)
    table["mask_kind"] = table["mask"].map(mask_kind)  # sort window/keypad ids by family, then by length
    table = table.sort_values(["dtype", "mask_kind", "head_dim", "batch", "heads", "kv_heads", "seq_k", "seq_q",
                               "phase"], key=lambda s: s.map(order) if s.name == "phase" else s)
    return table.drop(columns="mask_kind").reset_index(drop=True)


def headline(run: Run) -> pd.DataFrame:
    """Per backend: cases passed / failed / not run, median speedup per phase, median peak memory, wins."""
    per_case = run.verdicts.groupby(["backend", "case_id"], sort=False).status.agg(set)
    wins = winners(run).winner.value_counts() if run.has_perf else pd.Series(dtype=int)
    out = []
    for backend in run.backends:
        if backend not in per_case.index.get_level_values(0):
            continue
        statuses = per_case.loc[backend]
        bad = statuses.map(lambda s: bool(s & set(BAD)))
        passed = statuses.map(lambda s: "pass" in s) & ~bad
        rows = run.cases[run.cases.backend == backend]
        partial = passed & statuses.map(lambda s: bool(s & {"unsupported", "unavailable"}))
        entry = {"backend": backend, "cases": len(statuses), "passed": int(passed.sum()),
                 "of which partly run": int(partial.sum()), "failed": int(bad.sum()),
                 "not run": int((~passed & ~bad).sum())}
        if run.has_perf:
            for phase in PHASES:
                speedups = rows.loc[rows.phase == phase, "speedup"].dropna()
                if run.has_baseline and np.isfinite(run.df.loc[run.df.phase == phase, "speedup"]).any():
                    entry[f"median speedup {phase}"] = speedups.median() if len(speedups) else np.nan
            entry["median peak MiB"] = rows.peak_mem_mib.median()
            if run.has_baseline:
                entry["median memory vs baseline"] = rows.mem_vs_base.median()
            entry["wins"] = int(wins.get(backend, 0))
        out.append(entry)
    return pd.DataFrame(out)


def failures(run: Run) -> pd.DataFrame:
    """Rows that failed, errored or ran out of memory, with the figures that say why."""
    cols = ["backend", "case_id", "phase", "status", "err_ratio", "reason"]
    rows = run.cases[run.cases.status.isin(BAD)]
    # a fwd+bwd row that was not timed because fwd or bwd failed repeats that failure; list it once
    repeat = (rows.phase == "fwd+bwd") & rows.reason.fillna("").astype(str).str.startswith("not timed:")
    return rows.loc[~repeat, cols].reset_index(drop=True)


def not_run(run: Run) -> pd.DataFrame:
    """Distinct reasons a backend did not run (unsupported / unavailable), with how many rows each covers."""
    rows = pd.concat([run.verdicts, run.semantics])
    rows = rows[rows.status.isin(NOT_ANSWERED)]
    if rows.empty:  # (main-matrix fwd+bwd rows only repeat these reasons as "not timed: ...")
        return pd.DataFrame(columns=["backend", "status", "reason", "rows"])
    return rows.groupby(["backend", "status", rows.reason.fillna("")], sort=False).size().reset_index(name="rows")
