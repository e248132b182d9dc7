"""Results schema and storage: one CSV row per (case, backend, phase), appended as each finishes.

The file is an append-only log so an interrupted run keeps every finished row. A later stage of the
same run (e.g. timing after correctness) appends a row with the same key carrying its new columns;
`load_results` folds rows with one key into one (later non-empty values win), and `compact` rewrites
the file in that folded form at the end of a run.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Iterable, Mapping

import pandas as pd

SCHEMA_VERSION = 1

KEY = ("case_id", "backend", "phase")

COLUMNS: tuple[str, ...] = (
    "run_id", "case_id", "backend", "phase",
    # the case
    "batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim", "dtype", "mask", "scale", "device",
    # correctness
    "status", "reason", "out_err", "out_tol", "dq_err", "dq_tol", "dk_err", "dk_tol", "dv_err", "dv_tol",
    "naive_out_err", "naive_dq_err", "naive_dk_err", "naive_dv_err", "err_ratio", "nonfinite", "backend_op",
    "observed",
    # performance (filled by the benchmark stage)
    "latency_ms", "latency_iqr_ms", "latency_min_ms", "n_samples", "rounds", "round_spread", "timing_mode", "threads",
    "noisy",
    "peak_mem_bytes", "mem_method", "flops", "tflops", "pct_of_peak", "suspicious", "compile_ms",
    # provenance
    "device_name", "testbed_id", "torch_version", "backend_version", "git_sha", "timestamp", "schema_version",
)

#: raw timing samples, long format, one line per repetition: results/<run_id>/samples.csv. `round`: the
#: measurement round (rounds of one key are spread over the run, so they see its changing conditions)
SAMPLE_COLUMNS: tuple[str, ...] = ("run_id", "case_id", "backend", "phase", "round", "sample", "latency_ms")

STATUSES = ("pass", "fail", "unsupported", "unavailable", "error", "oom", "observed")
PHASES = ("fwd", "bwd", "fwd+bwd")


class ResultsWriter:
    """Appends rows to `path` (a CSV with the schema's columns), flushing each so nothing finished is lost."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists() or self.path.stat().st_size == 0:
            with self.path.open("w", newline="") as f:
                csv.DictWriter(f, fieldnames=COLUMNS).writeheader()

    def write(self, rows: Iterable[Mapping[str, object]]) -> None:
        rows = list(rows)
        for row in rows:
            unknown = set(row) - set(COLUMNS)
            if unknown:
                raise ValueError(f"unknown result columns {sorted(unknown)}; schema: {', '.join(COLUMNS)}")
            if row.get("status") not in STATUSES:
                raise ValueError(f"status={row.get('status')!r}; allowed: {', '.join(STATUSES)}")
            if row.get("phase") not in PHASES:
                raise ValueError(f"phase={row.get('phase')!r}; allowed: {', '.join(PHASES)}")
        with self.path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            for row in rows:
                writer.writerow({**row, "schema_version": SCHEMA_VERSION})
            f.flush()
            os.fsync(f.fileno())


class SamplesWriter:
    """Appends raw timing samples (one line per repetition) to the run's samples.csv."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists() or self.path.stat().st_size == 0:
            with self.path.open("w", newline="") as f:
                csv.writer(f).writerow(SAMPLE_COLUMNS)

    def write(self, run_id: str, case_id: str, backend: str, phase: str, samples_ms: Iterable[float],
              round_index: int = 0) -> None:
        with self.path.open("a", newline="") as f:
            writer = csv.writer(f)
            for i, value in enumerate(samples_ms):
                writer.writerow((run_id, case_id, backend, phase, round_index, i, repr(float(value))))
            f.flush()
            os.fsync(f.fileno())


def load_samples(run_dir: str | Path) -> pd.DataFrame:
    """Raw timing samples of a run (empty frame with the columns when it has none)."""
    path = Path(run_dir) / "samples.csv"
    if not path.exists():
        return pd.DataFrame(columns=list(SAMPLE_COLUMNS))
    df = pd.read_csv(path)
    if "round" not in df.columns:  # written before rounds existed: all samples are one round
        df.insert(SAMPLE_COLUMNS.index("round"), "round", 0)
    return df


def fold(df: pd.DataFrame) -> pd.DataFrame:
    """One row per key: for each column, the last non-empty value among the rows of that key."""
    if df.empty:
        return df
    return df.groupby(list(KEY), sort=False, dropna=False).last().reset_index()[list(df.columns)]


def load_results(path: str | Path) -> pd.DataFrame:
    """Load a results.csv (or a run directory holding one), folded to one row per (case, backend, phase)."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.csv"
    if not path.exists():
        raise FileNotFoundError(f"no results file at {path}")
    df = pd.read_csv(path, keep_default_na=True)
    missing = [c for c in KEY if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: not a harness results file (missing columns {missing})")
    return fold(df)


def compact(path: str | Path) -> pd.DataFrame:
    """Rewrite a results file folded to one row per key (atomically: write aside, then rename)."""
    path = Path(path)
    df = load_results(path)
    tmp = path.with_suffix(".csv.tmp")
    df.reindex(columns=list(COLUMNS)).to_csv(tmp, index=False)
    os.replace(tmp, path)
    return df
