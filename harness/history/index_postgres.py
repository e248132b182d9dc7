"""The history index in a team's PostgreSQL database (psycopg 3): each run's manifest, the columns history, noise
models and change points read, and its per-round medians; one transaction per run, so machines may ingest at once."""

from __future__ import annotations

import json

import pandas as pd

from harness.history.index_store import ROUND_COLUMNS, categorical
from harness.extras import missing
from harness.store.schema import KEY

#: the columns of each row the database keeps (history's table comes from the manifests)
PG_COLUMNS = ("run_id", "testbed_id", *KEY, "status", "started", "git_sha", "git_dirty", "torch", "backend_version",
              "latency_ms", "contention")
_TYPES = {"git_dirty": "boolean", "latency_ms": "double precision", "round": "double precision",
          "contention": "double precision"}
_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS harness_runs (name text PRIMARY KEY, manifest jsonb NOT NULL)",
    "CREATE TABLE IF NOT EXISTS harness_rows (run_name text NOT NULL, ord integer NOT NULL, "
    + ", ".join(f"{c} {_TYPES.get(c, 'text')}" for c in PG_COLUMNS) + ")",
    "CREATE INDEX IF NOT EXISTS harness_rows_run ON harness_rows (run_name)",
    # a database made before the column (index version 1): every run is read again (INDEX_VERSION), so it fills
    "ALTER TABLE harness_rows ADD COLUMN IF NOT EXISTS contention double precision",
    "CREATE TABLE IF NOT EXISTS harness_rounds (run_name text NOT NULL, ord integer NOT NULL, "
    + ", ".join(f"{c} {_TYPES.get(c, 'text')}" for c in ROUND_COLUMNS) + ")",
    "CREATE INDEX IF NOT EXISTS harness_rounds_run ON harness_rounds (run_name)",
]


class PostgresStore:
    """harness_runs (name, manifest), harness_rows and harness_rounds in the database at `url`."""

    def __init__(self, url: str):
        try:
            import psycopg
        except ImportError:
            raise missing("psycopg", f"--store {url!r} (a PostgreSQL store)") from None
        try:
            self.conn = psycopg.connect(url, autocommit=True)
        except psycopg.OperationalError as exc:
            raise ValueError(f"--store {url!r}: cannot connect ({str(exc).strip().splitlines()[0]})") from None
        with self.conn.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(hashtext('harness_schema'))")  # one creator at a time
            for statement in _SCHEMA:
                self.conn.execute(statement)

    def manifests(self) -> dict[str, dict]:
        return {name: manifest for name, manifest in self.conn.execute("SELECT name, manifest FROM harness_runs")}

    def put(self, entry) -> None:
        name = entry.manifest["name"]
        with self.conn.transaction():
            # one writer of a run at a time: two machines ingesting it at once must not both insert its rows
            self.conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (name,))
            self._delete(name)
            for table, frame, columns in (("harness_rows", entry.rows, PG_COLUMNS),
                                          ("harness_rounds", entry.rounds, ROUND_COLUMNS)):
                if frame is None or frame.empty:
                    continue
                frame = frame.reindex(columns=list(columns)).astype(object).where(frame.notna(), None)
                with self.conn.cursor().copy(f"COPY {table} (run_name, ord, {', '.join(columns)}) FROM STDIN") as cp:
                    for i, values in enumerate(frame.itertuples(index=False, name=None)):
                        cp.write_row((name, i, *values))
            self.conn.execute("INSERT INTO harness_runs VALUES (%s, %s) ON CONFLICT (name) DO UPDATE SET manifest = "
                              "EXCLUDED.manifest", (name, json.dumps(entry.manifest, default=str)))

    def _delete(self, name: str) -> None:
        for table in ("harness_runs", "harness_rows", "harness_rounds"):
            self.conn.execute(f"DELETE FROM {table} WHERE {'name' if table == 'harness_runs' else 'run_name'} = %s",
                              (name,))

    def drop(self, name: str) -> None:
        with self.conn.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (name,))
            self._delete(name)

    def _select(self, table: str, names: list[str], columns, where: str = "", params: tuple = ()) -> pd.DataFrame:
        cur = self.conn.execute(
            f"SELECT run_name, {', '.join(columns)} FROM {table} WHERE run_name = ANY(%s) {where} "
            "ORDER BY array_position(%s, run_name), ord", (names, *params, names))
        df = pd.DataFrame(cur.fetchall(), columns=["run_name", *columns])
        for column in df.columns:
            if df[column].dtype == object and column != "git_dirty":
                df[column] = df[column].astype("category")
        return categorical(df)

    def rows(self, names: list[str], columns, testbed: str | None, timed: bool) -> pd.DataFrame:
        columns = list(dict.fromkeys(columns or PG_COLUMNS))
        missing = [c for c in columns if c not in PG_COLUMNS]
        if missing:
            raise ValueError(f"the PostgreSQL index keeps {', '.join(PG_COLUMNS)}, not {', '.join(missing)}")
        where, params = "", ()
        if testbed is not None:
            where, params = "AND testbed_id = %s", (testbed,)
        if timed:
            where += " AND latency_ms > 0"
        return self._select("harness_rows", names, columns, where, params)

    def rounds(self, names: list[str]) -> pd.DataFrame:
        return self._select("harness_rounds", names, list(ROUND_COLUMNS))
