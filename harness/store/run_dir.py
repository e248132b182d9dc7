"""A run directory's layout (results.csv, samples.csv, env.json) and its environment file, read and written."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = "results.csv"
SAMPLES = "samples.csv"
ENV = "env.json"


def is_run_dir(path: str | Path) -> bool:
    return (Path(path) / RESULTS).exists()


def read_env(run_dir: str | Path) -> dict:
    """The run's env.json ({} when it has none)."""
    path = Path(run_dir) / ENV
    return json.loads(path.read_text()) if path.exists() else {}


def write_env(run_dir: str | Path, env: dict) -> None:
    (Path(run_dir) / ENV).write_text(json.dumps(env, indent=2, default=str) + "\n")


def resolve_run(arg: str | Path, results_dir: str | Path = "results") -> Path:
    """A run dir path, or a run id under results_dir."""
    for path in (Path(arg), Path(results_dir) / str(arg)):
        if is_run_dir(path):
            return path
    raise FileNotFoundError(f"run {str(arg)!r}: no {RESULTS} there nor under {results_dir}/{arg}")
