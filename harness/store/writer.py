"""Append-only writers of results.csv and samples.csv: every row is flushed to disk as soon as it exists."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Iterable

from harness.store.schema import COLUMNS, SAMPLE_COLUMNS, Row


def _start(path: str | Path, header: Iterable[str]) -> Path:
    """`path`, given its header line when it is new or empty."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        with path.open("w", newline="") as f:
            csv.writer(f).writerow(header)
    return path


def _append(path: Path, records: Iterable) -> None:
    with path.open("a", newline="") as f:
        csv.writer(f).writerows(records)
        f.flush()
        os.fsync(f.fileno())


class ResultsWriter:
    """Appends rows to `path` (a CSV with the schema's columns), flushing each so nothing finished is lost."""

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = _start(path, COLUMNS)

    def write(self, rows: Iterable[Row]) -> None:
        rows = list(rows)
        for row in rows:
            if not isinstance(row, Row):
                raise TypeError(f"ResultsWriter.write takes harness.store.schema.Row objects; got {type(row).__name__}")
        _append(self.path, (["" if (v := getattr(row, c)) is None else v for c in COLUMNS] for row in rows))


class SamplesWriter:
    """Appends raw timing samples (one line per repetition) to the run's samples.csv."""

    def __init__(self, path: str | Path):
        self.path = _start(path, SAMPLE_COLUMNS)

    def write(self, run_id: str, case_id: str, backend: str, phase: str, samples_ms: Iterable[float],
              round_index: int = 0) -> None:
        _append(self.path, ((run_id, case_id, backend, phase, round_index, i, repr(float(value)))
                            for i, value in enumerate(samples_ms)))


#: remeasure/pairs.csv: one line per paired round of `compare --remeasure`, what the run saw of the machine meanwhile
PAIR_COLUMNS = ("case_id", "backend", "phase", "round", "first", "base_median_ms", "new_median_ms", "base_contention",
                "new_contention", "load_average", "counted", "why_not")


class PairsWriter:
    """Appends one line per re-measured pair (PAIR_COLUMNS), flushed as it is timed."""

    def __init__(self, path: str | Path):
        self.path = _start(path, PAIR_COLUMNS)

    def write(self, **values) -> None:
        unknown = set(values) - set(PAIR_COLUMNS)
        if unknown:
            raise TypeError(f"PairsWriter.write: unknown column(s) {sorted(unknown)}; columns: {PAIR_COLUMNS}")
        _append(self.path, [["" if (v := values.get(c)) is None else v for c in PAIR_COLUMNS]])
