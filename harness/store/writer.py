"""Append-only writers of results.csv and samples.csv: every row is flushed to disk as soon as it exists."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Iterable

from harness.store.schema import COLUMNS, SAMPLE_COLUMNS, Row


def _cell(value: object) -> object:
    return "" if value is None else value


class ResultsWriter:
    """Appends rows to `path` (a CSV with the schema's columns), flushing each so nothing finished is lost."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists() or self.path.stat().st_size == 0:
            with self.path.open("w", newline="") as f:
                csv.writer(f).writerow(COLUMNS)

    def write(self, rows: Iterable[Row]) -> None:
        rows = list(rows)
        for row in rows:
            if not isinstance(row, Row):
                raise TypeError(f"ResultsWriter.write takes harness.store.schema.Row objects; got {type(row).__name__}")
        with self.path.open("a", newline="") as f:
            writer = csv.writer(f)
            for row in rows:
                writer.writerow([_cell(getattr(row, c)) for c in COLUMNS])
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
