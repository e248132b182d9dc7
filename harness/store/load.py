"""Reading a run's files: results.csv folded to one row per key, samples.csv, and rewriting results folded.

results.csv is an append-only log, so an interrupted run keeps every finished row. A later stage of the same
run (timing after correctness) appends a row with the same key carrying its new columns; `load_results` folds
the rows of one key into one (later non-empty values win), and `compact` rewrites the file folded.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pandas as pd

from harness.store.schema import COLUMNS, KEY, SAMPLE_COLUMNS

#: cells read as missing; `observed` is exempt (an observed 'nan' or 'None' is an answer, not a missing value)
_NA_STRINGS = ["", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>",
               "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"]
_VERBATIM = ("observed",)


def _header(path: Path) -> list[str]:
    with path.open(newline="") as f:
        return next(csv.reader(f), [])


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
    header = _header(path)
    na = {c: ([""] if c in _VERBATIM else _NA_STRINGS) for c in header}
    df = pd.read_csv(path, keep_default_na=False, na_values=na, dtype={c: str for c in _VERBATIM if c in header})
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
