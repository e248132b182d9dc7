"""A run directory's layout (results.csv, samples.csv, env.json) and its environment file, read and written."""

from __future__ import annotations

import json
import os
from pathlib import Path

RESULTS = "results.csv"
SAMPLES = "samples.csv"
ENV = "env.json"


def results_root(path: str | Path) -> Path:
    """The directory run directories go under, created if needed; a path that is a file or cannot be written is a
    ValueError naming it."""
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--results-dir {str(root)!r} is a file; it must be a directory (or not exist yet)")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--results-dir {str(root)!r} cannot be created: {exc.strerror or exc}") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise ValueError(f"--results-dir {str(root)!r} is not writable")
    return root


def is_run_dir(path: str | Path) -> bool:
    return (Path(path) / RESULTS).exists()


def read_env(run_dir: str | Path) -> dict:
    """The run's env.json ({} when it has none); a damaged one is a ValueError naming the file and the line."""
    path = Path(run_dir) / ENV
    if not path.exists():
        return {}
    try:
        env = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(env, dict):
        raise ValueError(f"{path}: expected a JSON object, found {type(env).__name__}")
    return env


def write_env(run_dir: str | Path, env: dict) -> None:
    (Path(run_dir) / ENV).write_text(json.dumps(env, indent=2, default=str) + "\n")


def resolve_run(arg: str | Path, results_dir: str | Path = "results") -> Path:
    """A run dir path, or a run id under results_dir."""
    for path in (Path(arg), Path(results_dir) / str(arg)):
        if is_run_dir(path):
            return path
    raise FileNotFoundError(f"run {str(arg)!r}: no {RESULTS} there nor under {results_dir}/{arg}")
