"""Reading a run's files strictly: results.csv folded to one row per key, samples.csv, and rewriting results folded."""

from __future__ import annotations

import csv
import io
import math
import os
import typing
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from harness.store.schema import (ALLOWED, COLUMNS, FIGURE_COLUMNS, KEY, SAMPLE_COLUMNS, SCHEMA_VERSION, Row,
                                  figures_usable)

#: cells read as missing; `observed` is exempt (an observed 'nan' or 'None' is an answer, not a missing value)
_NA_STRINGS = ["", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>",
               "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"]
_VERBATIM = ("observed", "modifiers")
#: the columns without which a file is no results file
REQUIRED = (*KEY, "status")
#: the frame attribute that carries how many lines of the file were refused (DataFrame.attrs)
REFUSED = "refused_rows"
#: how many refused lines a warning lists by number
_SHOWN = 5
#: column -> the type its cells must parse as (int, float, bool or str), from the schema's Row annotations
COLUMN_KINDS = {name: ([t for t in typing.get_args(hint) if t is not type(None)] or [hint])[0]
         for name, hint in typing.get_type_hints(Row).items()}
#: a latency is a duration: a finite number >= 0 (a negative or infinite one is a damaged cell)
DURATION = "duration"
_SAMPLE_KIND = {"round": int, "sample": int, "latency_ms": DURATION}
_TRUE_FALSE = {"true", "false", "1", "0", "1.0", "0.0"}


def refused_rows(df: pd.DataFrame) -> int:
    """How many lines of the file `df` was loaded from were refused (0 for a frame not made by this module)."""
    return int(df.attrs.get(REFUSED, 0))


def _cell_problem(column: str, cell: str, kind: type, required: bool) -> str | None:
    """Why `cell` cannot be column `column`'s value, or None."""
    empty = cell == "" if column in _VERBATIM else cell in _NA_STRINGS  # verbatim text columns keep "NA" as text
    if empty:
        return f"{column} is empty" if required else None
    allowed = ALLOWED.get(column)  # the schema's vocabulary: anything else is a damaged cell
    if allowed is not None and cell not in allowed:
        return f"{column} {cell[:40]!r} is not one of {', '.join(allowed)}"
    if kind in (int, float, DURATION):
        try:
            value = float(cell)
        except ValueError:
            return f"{column} {cell[:40]!r} is not a number"
        # ints are written '12', or '12.0' by a rewrite that held empty cells in the column
        if kind is int and not (math.isfinite(value) and value.is_integer()):
            return f"{column} {cell[:40]!r} is not an integer"
        if kind == DURATION and not (math.isfinite(value) and value >= 0):
            return f"{column} {cell[:40]!r} is not a duration (a finite number >= 0)"
    elif kind is bool and cell.strip().lower() not in _TRUE_FALSE:
        return f"{column} {cell[:40]!r} is not true or false"
    return None




def _as_numbers(cells: np.ndarray) -> np.ndarray:
    """float(cell) of each text cell, NaN where float() refuses it (numpy's cast of text objects is float())."""
    try:
        return cells.astype(np.float64)
    except (TypeError, ValueError):  # a damaged cell: the column is read cell by cell
        out = np.full(len(cells), np.nan)
        for i, cell in enumerate(cells):
            try:
                out[i] = float(cell)
            except ValueError:
                pass
        return out

#: bool cells accepted without asking _cell_problem (any other spelling is asked, e.g. ' TRUE ')
_PLAIN_BOOL = sorted(_TRUE_FALSE | {"True", "False", "TRUE", "FALSE"})


def _suspect_records(header: list[str], records: list[list[str]], required: tuple[str, ...],
                     kinds: dict) -> np.ndarray:
    """Per record, whether a cell may be refused by _cell_problem: checked a column at a time (a results file has
    ~375k cells; one Python call per cell took seconds). A record not marked has no cell _cell_problem refuses."""
    suspect = np.zeros(len(records), dtype=bool)
    if not records:
        return suspect
    table = np.empty((len(records), len(header)), dtype=object)
    table[:] = records
    missing = pd.Series(table.ravel(), dtype=object).isin(_NA_STRINGS).to_numpy().reshape(table.shape)  # one pass
    for j, column in enumerate(header):
        cells, kind = pd.Series(table[:, j], dtype=object), kinds.get(column, str)
        filled = ~((cells == "").to_numpy() if column in _VERBATIM else missing[:, j])
        if column in required:
            suspect |= ~filled
        if column in ALLOWED:
            suspect |= filled & ~cells.isin(ALLOWED[column]).to_numpy()
        if kind in (int, float, DURATION):
            whole = np.zeros(len(cells))
            whole[filled] = _as_numbers(table[filled, j])
            number = filled & ~np.isnan(whole)
            suspect |= filled & ~number  # a cell float() refuses or reads as NaN: asked cell by cell
            if kind is int:
                suspect |= number & ~(np.isfinite(whole) & (whole == np.floor(whole)))
            elif kind == DURATION:
                suspect |= number & ~(np.isfinite(whole) & (whole >= 0))
        elif kind is bool:
            suspect |= filled & ~cells.isin(_PLAIN_BOOL).to_numpy()
    return suspect


def _parse(path: Path, required: tuple[str, ...], kinds: dict) -> tuple[list[str], list, list, str | None]:
    """(header, the records that parse, [(line, why)] of those refused, the file's text when pandas may read it as it
    is: every record kept, none blank, no quote that the two parsers could read apart). A record is refused when its field count
    is not the header's (cut short, or run into the next), when the file ends inside it without a line end (a
    writer killed mid-line), or when a cell is not its column's kind."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a readable CSV (UnicodeDecodeError: {exc})") from None
    if "\x00" in text:
        raise ValueError(f"{path}: not a readable CSV (it holds NUL bytes: a binary or damaged file)")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, [])
        whole, refused, first, line, blank = [], [], reader.line_num + 1, 0, False
        for record in reader:
            line, first = first, reader.line_num + 1
            if not record:  # a blank line holds no row
                blank = True
                continue
            if len(record) != len(header):
                refused.append((line, f"{len(record)} fields where the header has {len(header)} (cut short or "
                                      "damaged)"))
            else:
                whole.append((line, record))
    except csv.Error as exc:
        raise ValueError(f"{path}: not a readable CSV (line {reader.line_num}: {exc})") from None
    records = []
    # a record with a suspect cell is asked cell by cell (the first cell that is not its column's kind says why)
    suspect = _suspect_records(header, [record for _, record in whole], required, kinds)
    for i, (at, record) in enumerate(whole):
        why = None if not suspect[i] else next(filter(None, (
            _cell_problem(column, cell, kinds.get(column, str), column in required)
            for column, cell in zip(header, record))), None)
        if why:
            refused.append((at, why))
        else:
            records.append((at, record))
    refused.sort(key=lambda item: item[0])
    if records and records[-1][0] == line and not text.endswith(("\n", "\r")):
        records.pop()  # every writer ends a line it finished: this one was cut, maybe inside its last cell
        refused.append((line, "the file ends inside it (a writer stopped mid-line)"))
    as_is = not refused and not blank and bool(records) and '"' not in text and not text.startswith("\ufeff") \
        and text.count("\r") == text.count("\r\n")
    return header, [record for _, record in records], refused, text if as_is else None


def _warn_refused(path: Path, refused: list[tuple[int, str]]) -> None:
    if refused:
        shown = "; ".join(f"line {line}: {why}" for line, why in refused[:_SHOWN])
        more = f"; and {len(refused) - _SHOWN} more" if len(refused) > _SHOWN else ""
        warnings.warn(f"{path}: refused {len(refused)} line(s) that do not parse ({shown}{more}); the rest is read",
                      stacklevel=3)


def _frame(header: list[str], records: list[list[str]], text: str | None, **kwargs) -> pd.DataFrame:
    """The records that parsed, read by pandas exactly as a clean file would be (`text`: the file, when it is one)."""
    if text is not None:
        return pd.read_csv(io.StringIO(text, newline=""), **kwargs)
    buffer = io.StringIO()
    csv.writer(buffer).writerows([header, *records])
    buffer.seek(0)
    return pd.read_csv(buffer, **kwargs)


def load_samples(run_dir: str | Path, folded: pd.DataFrame | None = None) -> pd.DataFrame:
    """Raw timing samples of a run (empty frame with the columns when it has none); lines that do not parse (a
    latency that is no finite number >= 0, a cut line) are refused with a warning and counted (`refused_rows`).
    `folded`: the run's results as load_results gave them, when the caller has them (not read twice)."""
    path = Path(run_dir) / "samples.csv"
    if not path.exists():
        return pd.DataFrame(columns=list(SAMPLE_COLUMNS))
    header, records, refused, text = _parse(path, (*KEY, "latency_ms"), _SAMPLE_KIND)
    missing = [c for c in SAMPLE_COLUMNS if c not in header and c != "round"]
    if missing:
        raise ValueError(f"{path}: not a harness samples file (missing columns {missing})")
    _warn_refused(path, refused)
    df = _frame(header, records, text, dtype={k: str for k in KEY})
    if "round" not in df.columns:  # written before rounds existed: all samples are one round
        df.insert(SAMPLE_COLUMNS.index("round"), "round", 0)  # every other column is there (checked above)
    df["latency_ms"] = pd.to_numeric(df["latency_ms"], errors="coerce")
    results = Path(run_dir) / "results.csv"
    if folded is None and results.exists() and not df.empty:
        try:
            with warnings.catch_warnings():  # results.csv's refused lines are said where it is loaded
                warnings.simplefilter("ignore")
                folded = load_results(results)
        except ValueError:  # a results file that cannot be read says so where it is read; no key is withheld
            folded = pd.DataFrame()
    # a rejected key's samples are never figures, an earlier round's neither (absent before timing_status existed)
    if folded is not None and not df.empty and "timing_status" in folded.columns:
        bad = folded.loc[~folded.timing_status.map(figures_usable).astype(bool), list(KEY)]
        withheld = set(bad.itertuples(index=False, name=None))
        df = df[[k not in withheld for k in df[list(KEY)].itertuples(index=False, name=None)]] if withheld else df
    df.attrs[REFUSED] = len(refused)
    return df


def usable_figures(df: pd.DataFrame) -> pd.DataFrame:
    """Folded results with the figures of every row whose timing was rejected emptied: its latency, even an
    earlier round's that the fold carried, is no number anyone may read (the reason says what was claimed)."""
    if df.empty or "timing_status" not in df.columns:
        return df
    withheld = ~df.timing_status.map(figures_usable).astype(bool)
    if withheld.any():
        df = df.copy()
        for column in (c for c in FIGURE_COLUMNS if c in df.columns):
            df[column] = df[column].astype(object)
            df.loc[withheld, column] = None
            df[column] = pd.to_numeric(df[column], errors="coerce") if column != "noisy" else df[column]
    return df


def load_results(path: str | Path) -> pd.DataFrame:
    """Load a results.csv (or a run directory holding one), folded to one row per (case, backend, phase). Lines that
    do not parse are refused with a warning; `refused_rows(df)` says how many."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.csv"
    if not path.exists():
        raise FileNotFoundError(f"no results file at {path}")
    try:
        header, records, refused, text = _parse(path, KEY, COLUMN_KINDS)
    except OSError as exc:
        raise ValueError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise ValueError(f"{path}: not a harness results file (missing columns {missing})")
    if len(set(header)) != len(header):
        raise ValueError(f"{path}: not a harness results file (a column named twice in its header)")
    _warn_refused(path, refused)
    na = {c: ([""] if c in _VERBATIM else _NA_STRINGS) for c in header}
    df = _frame(header, records, text, keep_default_na=False, na_values=na,
                dtype={c: str for c in (*_VERBATIM, *KEY) if c in header})
    # a file written by a newer harness is refused: its columns may mean something else
    versions = pd.to_numeric(df.get("schema_version", pd.Series(dtype=float)), errors="coerce").dropna()
    if len(versions) and versions.max() > SCHEMA_VERSION:
        raise ValueError(f"{path}: written with results schema {int(versions.max())}; this harness reads up to "
                         f"{SCHEMA_VERSION} (upgrade the harness to read it)")
    if not df.empty:  # folded: one row per key, each column its last non-empty value among the key's rows
        df = df.groupby(list(KEY), sort=False, dropna=False).last().reset_index()[list(df.columns)]
    df = usable_figures(df)
    df.attrs[REFUSED] = len(refused)
    return df


def compact(path: str | Path) -> pd.DataFrame:
    """Rewrite a results file folded to one row per key (atomically: write aside, then rename). A file with lines
    the loader refused is left as it is: rewriting it would drop them without a trace."""
    path = Path(path)
    df = load_results(path)
    if refused_rows(df):
        return df
    tmp = path.with_suffix(".csv.tmp")
    df.reindex(columns=list(COLUMNS)).to_csv(tmp, index=False)
    os.replace(tmp, path)
    return df
