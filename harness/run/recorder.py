"""What a run leaves behind: its id and folder, the results and samples writers, env.json and where time went."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable

from harness.measure import stages
from harness.store.load import compact
from harness.store.run_dir import RESULTS, SAMPLES, write_env
from harness.store.run_state import COMPLETE, INTERRUPTED, RUNNING, START
from harness.store.schema import Row, TimingKey
from harness.store.writer import ResultsWriter, SamplesWriter


class RunRecorder:
    """Writes a run's rows as made, its samples and env.json in `run_dir`; else rows to `results_path`, if given."""

    def __init__(self, run_id: str, run_dir: Path | None = None, env: dict | None = None, *,
                 results_path: Path | None = None):
        if run_dir is not None and results_path is not None:
            raise ValueError("a recorder writes to a run folder or to one results_path, not both")
        self.run_id, self.run_dir = run_id, None if run_dir is None else Path(run_dir)
        self._started = time.monotonic()
        #: seconds spent in each suite stage's tests (correctness, probes, benchmark), from pytest's reports
        self.test_seconds: dict[str, float] = {}
        #: what the stages did, counted (measure.stages.COUNT_CHECKED, COUNT_TIMED): a stage's seconds per unit of work
        self.counts: dict[str, int] = {}
        self.env: dict = dict(env or {})
        if self.run_dir is not None:
            stages.STAGE_CLOCK.reset()  # a run's time_spent starts with it; a folder-less check leaves the clock alone
            self.env.update(status=RUNNING, stage=START)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            results_path = self.run_dir / RESULTS
        self.writer = None if results_path is None else ResultsWriter(results_path)
        self.samples = None if self.run_dir is None else SamplesWriter(self.run_dir / SAMPLES)
        self.save_env()

    def write(self, rows: Iterable[Row]) -> None:
        if self.writer is not None:
            self.writer.write(rows)

    def write_samples(self, key: TimingKey, samples_ms: Iterable[float], round_index: int) -> None:
        """One round's raw samples of `key` (kept only in a run folder)."""
        if self.samples is not None:
            self.samples.write(self.run_id, *key, samples_ms, round_index=round_index)

    def add_test_seconds(self, stage_name: str, seconds: float) -> None:
        self.test_seconds[stage_name] = self.test_seconds.get(stage_name, 0.0) + seconds

    def count(self, what: str) -> None:
        """One more unit of `what` (measure.stages.COUNT_CHECKED or COUNT_TIMED) done."""
        self.counts[what] = self.counts.get(what, 0) + 1

    def time_spent(self) -> dict:
        """Where the run's wall time went so far: per suite stage, and per harness stage (measure.stages)."""
        budget = self.env.get("round_timing") or {}
        return {"wall_s": round(time.monotonic() - self._started, 3),
                "tests_s": {k: round(v, 3) for k, v in self.test_seconds.items()},
                "stages": {name: {"s": round(s, 3), "n": n} for name, (s, n) in stages.STAGE_CLOCK.snapshot().items()},
                "counts": dict(self.counts),
                "round_budget_ms": budget.get("warmup_ms", 0.0) + budget.get("budget_ms", 0.0) if budget else None}

    def enter_stage(self, name: str) -> None:
        """Record in env.json that the run is now in stage `name`."""
        if self.env.get("stage") != name:
            self.env["stage"] = name
            self.save_env()

    def save_env(self) -> None:
        if self.run_dir is not None:
            write_env(self.run_dir, self.env)

    def finish(self, *, complete: bool = True, **env: object) -> None:
        """Record the end-of-run facts `env`, the time spent and `complete`; fold the results to a row per key."""
        self.env.update(env)
        self.env["status"] = COMPLETE if complete else INTERRUPTED
        self.env["time_spent"] = self.time_spent()
        self.save_env()
        if self.run_dir is not None:
            compact(self.writer.path)
