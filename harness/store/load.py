"""Reading a run's files: results.csv folded to one row per key, samples.csv, and rewriting results folded.

results.csv is an append-only log, so an interrupted run keeps every finished row. A later stage of the same
run (timing after correctness) appends a row with the same key carrying its new columns; `load_results` folds
the rows of one key into one (later non-empty values win), and `compact` rewrites the file folded. Every error
names the file; a line cut short by a killed writer is dropped with a warning, not a crash.
"""

from __future__ import annotations

import csv
import os
import warnings
from pathlib import Path

import pandas as pd

from harness.store.schema import COLUMNS, FIGURE_COLUMNS, KEY, SAMPLE_COLUMNS, SCHEMA_VERSION, figures_usable

#: cells read as missing; `observed` is exempt (an observed 'nan' or 'None' is an answer, not a missing value)
_NA_STRINGS = ["", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>",
               "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"]
_VERBATIM = ("observed", "modifiers")
#: the columns without which a file is no results file
REQUIRED = (*KEY, "status")


def _header(path: Path) -> list[str]:
    try:
        with path.open(newline="") as f:
            return next(csv.reader(f), [])
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"{path}: not a readable CSV ({type(exc).__name__}: {exc})") from None


def _read_csv(path: Path, **kwargs) -> pd.DataFrame:
    try:
        return pd.read_csv(path, **kwargs)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable CSV ({type(exc).__name__}: {str(exc).strip().splitlines()[0]})") \
            from None


def _complete(df: pd.DataFrame, path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """Rows with every key column filled; a line cut short (a run killed while writing it) is dropped, said once."""
    partial = df[list(columns)].isna().any(axis=1)
    if partial.any():
        lines = ", ".join(str(i + 2) for i in df.index[partial][:5])  # +2: the header is line 1
        warnings.warn(f"{path}: dropped {int(partial.sum())} incomplete line(s) (line {lines}): a run was "
                      "interrupted while writing", stacklevel=3)
    return df[~partial]


def load_samples(run_dir: str | Path) -> pd.DataFrame:
    """Raw timing samples of a run (empty frame with the columns when it has none)."""
    path = Path(run_dir) / "samples.csv"
    if not path.exists():
        return pd.DataFrame(columns=list(SAMPLE_COLUMNS))
    df = _read_csv(path)
    if "round" not in df.columns:  # written before rounds existed: all samples are one round
        df.insert(min(SAMPLE_COLUMNS.index("round"), len(df.columns)), "round", 0)
    missing = [c for c in SAMPLE_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: not a harness samples file (missing columns {missing})")
    df = _complete(df, path, (*KEY, "latency_ms"))
    df["latency_ms"] = pd.to_numeric(df["latency_ms"], errors="coerce")
    results = Path(run_dir) / "results.csv"
    if results.exists() and not df.empty:  # a rejected key's samples are never figures, an earlier round's neither
        withheld = withheld_keys(load_results(results))
        if withheld:
            df = df[[tuple(k) not in withheld for k in df[list(KEY)].itertuples(index=False)]]
    return df


def withheld_keys(results: pd.DataFrame) -> set[tuple]:
    """The keys of folded results whose figures may not be used (schema.figures_usable)."""
    if "timing_status" not in results.columns:
        return set()
    bad = results[~results.timing_status.map(figures_usable)]
    return {tuple(k) for k in bad[list(KEY)].itertuples(index=False)}


def usable_figures(df: pd.DataFrame) -> pd.DataFrame:
    """Folded results with the figures of every row whose timing was rejected emptied: its latency, even an
    earlier round's that the fold carried, is no number anyone may read (the reason says what was claimed)."""
    if df.empty or "timing_status" not in df.columns:
        return df
    withheld = ~df.timing_status.map(figures_usable)
    if withheld.any():
        df = df.copy()
        for column in (c for c in FIGURE_COLUMNS if c in df.columns):
            df[column] = df[column].astype(object)
            df.loc[withheld, column] = None
            df[column] = pd.to_numeric(df[column], errors="coerce") if column != "noisy" else df[column]
    return df


def fold(df: pd.DataFrame) -> pd.DataFrame:
    """One row per key: for each column, the last non-empty value among the rows of that key."""
    if df.empty:
        return df
    return df.groupby(list(KEY), sort=False, dropna=False).last().reset_index()[list(df.columns)]


def check_schema_version(df: pd.DataFrame, path: Path) -> None:
    """Refuse a file written by a newer harness than this one (its columns may mean something else)."""
    if "schema_version" not in df.columns:
        return
    versions = pd.to_numeric(df["schema_version"], errors="coerce").dropna()
    if len(versions) and versions.max() > SCHEMA_VERSION:
        raise ValueError(f"{path}: written with results schema {int(versions.max())}; this harness reads up to "
                         f"{SCHEMA_VERSION} (upgrade the harness to read it)")


def load_results(path: str | Path) -> pd.DataFrame:
    """Load a results.csv (or a run directory holding one), folded to one row per (case, backend, phase).

    A file from an older schema gets the columns it lacks, empty; one from a newer schema is refused."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.csv"
    if not path.exists():
        raise FileNotFoundError(f"no results file at {path}")
    header = _header(path)
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise ValueError(f"{path}: not a harness results file (missing columns {missing})")
    na = {c: ([""] if c in _VERBATIM else _NA_STRINGS) for c in header}
    df = _read_csv(path, keep_default_na=False, na_values=na, dtype={c: str for c in _VERBATIM if c in header})
    check_schema_version(df, path)
    return usable_figures(fold(_complete(df, path, KEY)))


def compact(path: str | Path) -> pd.DataFrame:
    """Rewrite a results file folded to one row per key (atomically: write aside, then rename)."""
    path = Path(path)
    df = load_results(path)
    tmp = path.with_suffix(".csv.tmp")
    df.reindex(columns=list(COLUMNS)).to_csv(tmp, index=False)
    os.replace(tmp, path)
    return df
