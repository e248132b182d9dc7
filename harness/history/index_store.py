"""Where the history index lives: a folder of Parquet files (one per run, each written aside then renamed, so any
number of processes or machines may ingest at once), or a PostgreSQL database (index_postgres.py)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pandas as pd

try:
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq
except ImportError:  # the `history` extra: a store says so when it is opened, not every import of the gate
    pa = ds = pq = None

from harness.extras import missing
from harness.store.load import COLUMN_KINDS, DURATION
from harness.store.schema import KEY

MANIFESTS, ROWS, ROUNDS = "runs", "rows", "rounds"
ROUND_COLUMNS = (*KEY, "round", "latency_ms")


#: columns beside the results schema's, and their stored types
_EXTRA_KINDS = {"refused_rows": int, "git_dirty": bool, "round": int}


def column_kind(column: str) -> type | str:
    """The type a column is stored as: a results column's schema kind, else text (refused_rows, git_dirty aside)."""
    return COLUMN_KINDS.get(column) or _EXTRA_KINDS.get(column, str)


def arrow_type(column: str) -> pa.DataType:
    """The column's type in the index: numbers float64, flags bool, text read back as a dictionary (categorical)."""
    kind = column_kind(column)
    if column == "refused_rows":
        return pa.int64()
    if kind in (int, float, DURATION):
        return pa.float64()
    return pa.bool_() if kind is bool else pa.dictionary(pa.int32(), pa.string())


def _atomic_write(path: Path, write) -> None:
    """Write through a file of this process's own beside `path`, then rename: a reader sees all of it or none."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def categorical(df: pd.DataFrame) -> pd.DataFrame:
    """Every categorical column with its categories in sorted order (sorting by it then sorts by its text)."""
    for column in df.columns:
        if isinstance(df[column].dtype, pd.CategoricalDtype):
            df[column] = df[column].cat.reorder_categories(sorted(df[column].cat.categories))
    return df


class ParquetStore:
    """runs/<run>.json (its manifest, written last), rows/<run>.parquet and rounds/<run>.parquet under `path`."""

    def __init__(self, path: Path):
        if pa is None:
            raise missing("pyarrow", "the history index")
        self.path = path
        try:
            for sub in (MANIFESTS, ROWS, ROUNDS):
                (path / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"history index {str(path)!r} cannot be made ({exc.strerror or exc}); pass --store PATH "
                             "(a folder this user can write) or a postgresql:// URL") from None

    def manifests(self) -> dict[str, dict]:
        out = {}
        for f in (self.path / MANIFESTS).glob("*.json"):
            if not f.name.startswith("."):
                try:
                    out[f.stem] = json.loads(f.read_text())
                except (OSError, json.JSONDecodeError):  # removed by a concurrent drop: read again on next sync
                    continue
        return out

    def put(self, entry) -> None:
        name = entry.manifest["name"]
        for sub, table in ((ROWS, entry.rows), (ROUNDS, entry.rounds)):
            path = self.path / sub / f"{name}.parquet"
            if table is None:
                path.unlink(missing_ok=True)
            else:
                arrow = pa.Table.from_pandas(table, preserve_index=False)
                _atomic_write(path, lambda tmp: pq.write_table(arrow, tmp))
        text = json.dumps(entry.manifest, default=str)
        _atomic_write(self.path / MANIFESTS / f"{name}.json", lambda tmp: tmp.write_text(text))

    def drop(self, name: str) -> None:
        (self.path / MANIFESTS / f"{name}.json").unlink(missing_ok=True)  # first: no manifest, no run
        for sub in (ROWS, ROUNDS):
            (self.path / sub / f"{name}.parquet").unlink(missing_ok=True)

    def _read(self, sub: str, names: list[str], columns, filters) -> pd.DataFrame:
        files = [str(self.path / sub / f"{n}.parquet") for n in names]
        files = [f for f in files if os.path.exists(f)]
        if columns is None:  # every column any run has
            columns = list(dict.fromkeys(c for f in files for c in pq.read_schema(f).names))
        columns = [c for c in dict.fromkeys([*columns, "run_name"])]
        if not files:
            return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
        schema = pa.schema([(c, arrow_type(c)) for c in columns])
        text = [c for c in columns if pa.types.is_dictionary(schema.field(c).type)]
        fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=text))
        table = ds.dataset(files, schema=schema, format=fmt).to_table(columns=columns, filter=filters)
        return categorical(table.to_pandas())

    def rows(self, names: list[str], columns, testbed: str | None, timed: bool) -> pd.DataFrame:
        filters = None
        if testbed is not None:
            filters = ds.field("testbed_id") == testbed
        if timed:
            filters = (ds.field("latency_ms") > 0) if filters is None else filters & (ds.field("latency_ms") > 0)
        return self._read(ROWS, names, columns, filters)

    def rounds(self, names: list[str]) -> pd.DataFrame:
        return self._read(ROUNDS, names, ROUND_COLUMNS, None)
