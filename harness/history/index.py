"""The history index: each run folder's rows, env fields and per-round medians read once (by the strict loader) into
a store beside the runs, so that history, noise models and change points read a few columns instead of every CSV."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from harness.history.stored import load_run, run_dirs, run_notes_lines, summarize
from harness.history.index_store import ParquetStore, column_kind
from harness.store.load import DURATION, load_samples
from harness.store.run_dir import ENV, RESULTS, SAMPLES
from harness.store.schema import KEY

#: bumped when what a run's entry holds changes: every run is then read again
INDEX_VERSION = 2  # 2: rows carry contention (schema 7) and each run its plugin kernels
#: the index's folder under a results directory (created on first use)
INDEX_DIR = "index"
#: the columns `history --changes` and the report's history section read (change points and their two sides)
CHANGE_COLUMNS = ("testbed_id", *KEY, "started", "run_id", "git_sha", "torch", "backend_version", "latency_ms",
                  "contention")
#: the columns the noise model groups runs by: the same code is the same sha, dirty flag, torch and backend version
CODE_COLUMNS = ("git_sha", "git_dirty", "torch", "backend_version")
#: runs read at once to build a noise model: its peak memory follows this, not the number of runs
RUNS_AT_ONCE = 25
def open_store(where: str | Path):
    """A PostgreSQL URL (postgresql://...) or a folder (created on first use)."""
    text = str(where)
    if text.startswith(("postgresql://", "postgres://")):
        from harness.history.index_postgres import PostgresStore  # psycopg, imported only for a PostgreSQL store
        return PostgresStore(text)
    if "://" in text:
        raise ValueError(f"--store {text!r}: not a folder nor a postgresql:// URL (allowed: a path, postgresql://...)")
    return ParquetStore(Path(where))


def fingerprint(run_dir: Path) -> dict:
    """(size, mtime in ns) of each of a run's files, or None where absent: an entry is read again when it changes."""
    out = {}
    for name in (RESULTS, SAMPLES, ENV):
        try:
            st = (run_dir / name).stat()
            out[name] = [st.st_size, st.st_mtime_ns]
        except FileNotFoundError:
            out[name] = None
    return out


def round_median_rows(samples: pd.DataFrame) -> pd.DataFrame:
    """Per (case, backend, phase, round): the median of its latencies > 0 (what the noise model reads of samples)."""
    samples = samples[samples.latency_ms > 0]
    return samples.groupby([*KEY, "round"], sort=False).latency_ms.median().reset_index()


def typed(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with every column as its stored type (numbers float, flags bool, the rest text), so that every run's
    entry has one schema whatever pandas guessed from its cells (a sha of digits read as a number, say)."""
    out = {}
    for column in df.columns:
        s, kind = df[column], column_kind(column)
        if kind is int and column == "refused_rows":
            out[column] = s.fillna(0).astype("int64")
        elif kind in (int, float, DURATION):
            out[column] = pd.to_numeric(s, errors="coerce").astype("float64")
        elif kind is bool:
            out[column] = s.astype(object) if s.dtype == bool else _per_value(
                s, lambda v: str(v).strip().lower() in ("true", "1", "1.0"))
        elif pd.api.types.infer_dtype(s, skipna=True) in ("string", "empty"):  # text already: no call per cell
            out[column] = s.astype(object).where(s.notna(), None)
        else:
            out[column] = _per_value(s, str)
    return pd.DataFrame(out, index=df.index)


def _per_value(s: pd.Series, convert) -> pd.Series:
    """convert(v) of each cell, None where missing: asked once per distinct value (a column of 5,000 cells holds a
    few), cell by cell where distinct values could hash alike yet print apart (mixed objects, -0.0 beside 0.0)."""
    if s.dtype == object and pd.api.types.infer_dtype(s, skipna=True) != "boolean" or (
            s.dtype.kind == "f" and (s == 0).any()):
        return s.map(lambda v: None if _missing(v) else convert(v)).astype(object)
    codes, uniques = pd.factorize(s, use_na_sentinel=True)
    values = np.empty(len(uniques) + 1, dtype=object)
    values[:-1] = [convert(v) for v in uniques]  # codes of missing cells are -1: the last slot, None
    return pd.Series(values[codes], index=s.index, dtype=object)


def _missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


@dataclass
class RunEntry:
    """What the index keeps of one run folder: its manifest (status, summary, notes, warnings) and its tables."""

    manifest: dict
    rows: pd.DataFrame | None = None
    rounds: pd.DataFrame | None = None


def read_run(run_dir: Path) -> RunEntry:
    """Read one run folder as the CSV path does: a run the strict loader refuses is recorded with its one-line
    reason; the warnings it gives (refused lines) are kept to be given again on every query."""
    manifest = {"name": run_dir.name, "version": INDEX_VERSION, "fingerprint": fingerprint(run_dir)}
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            rows = load_run(run_dir)
        except (OSError, ValueError, pd.errors.ParserError) as exc:
            return RunEntry({**manifest, "status": "refused", "reason": f"skipping run {run_dir}: {exc}",
                             "warnings": [str(w.message) for w in said]})
    manifest.update(status="ok", warnings=[str(w.message) for w in said])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            rounds = round_median_rows(load_samples(run_dir, rows))
        except (OSError, ValueError, pd.errors.ParserError) as exc:
            rounds, manifest["samples_error"] = None, str(exc)
    manifest["samples_warnings"] = [str(w.message) for w in said]
    summary = summarize(rows).iloc[0].to_dict() if not rows.empty else None
    manifest.update(
        summary={k: (None if _missing(v) else v.item() if hasattr(v, "item") else v) for k, v in summary.items()}
        if summary else None,
        run_id=str(rows.run_id.iloc[0]) if len(rows) else run_dir.name,
        incomplete=str(rows["incomplete"].iloc[0] or "") if len(rows) else "",
        refused_rows=int(rows["refused_rows"].iloc[0]) if len(rows) else 0,
        testbeds=sorted(set(rows.testbed_id.dropna().astype(str))) if "testbed_id" in rows else [],
        has_rows=not rows.empty)
    return RunEntry(manifest, typed(rows.drop(columns=["run_dir"]).assign(run_name=run_dir.name)),
                    None if rounds is None else typed(rounds).assign(run_name=run_dir.name))


class HistoryIndex:
    """A results directory's runs as the index holds them, brought up to date (`sync`) on first use."""

    def __init__(self, results_dir: str | Path = "results", store: str | Path | None = None):
        self.root = Path(results_dir)
        self.store = open_store(store if store is not None else self.root / INDEX_DIR)
        self.manifests: dict[str, dict] = {}
        self.folders: dict[str, Path] = {}
        self.ingested: list[str] = []

    def sync(self) -> "HistoryIndex":
        """Read every run folder that is new or whose files changed since it was read; forget removed ones."""
        self.folders = folders = {p.name: p for p in run_dirs(self.root)}
        known = self.store.manifests()
        for name in sorted(set(known) - set(folders)):
            self.store.drop(name)
        for name, run_dir in folders.items():
            entry = known.get(name)
            if entry is None or entry.get("version") != INDEX_VERSION or entry["fingerprint"] != fingerprint(run_dir):
                self.store.put(read_run(run_dir))
                self.ingested.append(name)
        self.manifests = {name: m for name, m in sorted(self.store.manifests().items()) if name in folders}
        return self

    def run_dir(self, name: str) -> str:
        return str(self.folders.get(name, self.root / name))

    def _given(self, which: str = "warnings") -> list[dict]:
        """Manifests of the runs that can be read, after saying (as warnings) what the loader said of them."""
        ok = []
        for m in self.manifests.values():
            for text in m.get(which, []):
                warnings.warn(text, UserWarning, stacklevel=3)
            if m["status"] == "refused":
                warnings.warn(m["reason"], UserWarning, stacklevel=3)
            else:
                ok.append(m)
        return ok

    def summary(self, testbed: str | None = None) -> pd.DataFrame:
        """One line per run, as history.stored.summarize gives from the CSVs (oldest first)."""
        rows = [m["summary"] for m in self._given() if m.get("summary")]
        if testbed is not None:
            rows = [r for r in rows if str(r.get("testbed_id")) == testbed]
        if not rows:
            return summarize(pd.DataFrame())
        df = pd.DataFrame(rows).reindex(columns=summarize(pd.DataFrame()).columns)  # a database may reorder them
        return df.sort_values("started", na_position="first").reset_index(drop=True)

    def notes(self, testbed: str | None = None) -> list[str]:
        """The lines history prints under its table: runs that did not finish, lines refused."""
        frame = pd.DataFrame([{"run_dir": self.run_dir(m["name"]), "run_id": m["run_id"],
                               "incomplete": m["incomplete"], "refused_rows": m["refused_rows"]}
                              for m in self.manifests.values() if m["status"] == "ok"
                              and (testbed is None or testbed in m["testbeds"])])
        return run_notes_lines(frame)

    def testbeds(self) -> list[str]:
        return sorted({t for m in self.manifests.values() if m["status"] == "ok" for t in m["testbeds"]})

    def rows(self, columns: tuple[str, ...] | None = None, testbed: str | None = None,
             timed: bool = False) -> pd.DataFrame:
        """The runs' rows (env fields added, `run_dir`), of `testbed` only, timed ones only; text columns come
        back categorical (categories sorted, so that sorting by one sorts by its text)."""
        # only the runs that hold rows of the testbed are opened (the manifest says which)
        names = [m["name"] for m in self._given()
                 if m.get("has_rows") and (testbed is None or testbed in m["testbeds"])]
        df = self.store.rows(names, columns, testbed, timed)
        return self._with_run_dir(df)

    def rounds(self, testbed: str | None = None) -> pd.DataFrame:
        """Per-round medians (case, backend, phase, round, latency_ms, run_dir) of the runs of `testbed`."""
        given = self._given("samples_warnings")
        bad = [m for m in given if m.get("samples_error") and (testbed is None or testbed in m["testbeds"])]
        if bad:
            raise ValueError(bad[0]["samples_error"])
        names = [m["name"] for m in given if m.get("has_rows") and (testbed is None or testbed in m["testbeds"])]
        return self._with_run_dir(self.store.rounds(names))

    def noise_parts(self, columns: tuple[str, ...], testbed: str, runs_at_once: int = RUNS_AT_ONCE):
        """(rows, rounds) of `testbed`'s runs, `runs_at_once` runs at a time (rows(columns, testbed) and
        rounds(testbed) cut by run): a noise model is built a part at a time."""
        names = [m["name"] for m in self._given() if m.get("has_rows") and testbed in m["testbeds"]]
        bad = [m for m in self._given("samples_warnings") if m.get("samples_error") and testbed in m["testbeds"]]
        if bad:
            raise ValueError(bad[0]["samples_error"])
        for i in range(0, len(names), runs_at_once):
            some = names[i:i + runs_at_once]
            yield (self._with_run_dir(self.store.rows(some, columns, testbed, False)),
                   self._with_run_dir(self.store.rounds(some)))

    def _with_run_dir(self, df: pd.DataFrame) -> pd.DataFrame:
        names = df.pop("run_name").astype("category") if "run_name" in df else pd.Series([], dtype="category")
        df["run_dir"] = names.cat.rename_categories([self.run_dir(n) for n in names.cat.categories])
        return df


def open_index(results_dir: str | Path = "results", store: str | Path | None = None) -> HistoryIndex:
    """The index of `results_dir` (by default its own, under results_dir/index), brought up to date."""
    return HistoryIndex(results_dir, store).sync()
