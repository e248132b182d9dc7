"""A run directory's layout (results.csv, samples.csv, env.json, a recommendation's advice) and its environment file,
read and written."""

from __future__ import annotations

import json
import os
from pathlib import Path

RESULTS = "results.csv"
SAMPLES = "samples.csv"
ENV = "env.json"
#: what `recommend` printed, and the same as data (`recommend --format json`), in its run folder
ADVICE_TEXT = "advice.txt"
ADVICE_JSON = "advice.json"


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
    """A run dir path, or a run id under results_dir; anything else is a FileNotFoundError that quotes the path
    as given and says what it looks like (a results.csv file, a results root and its runs, nothing)."""
    given = Path(arg)
    candidates = [given] if given.is_absolute() else [given, Path(results_dir) / given]
    for path in candidates:
        if is_run_dir(path):
            return path
    if given.name == RESULTS and given.is_file():
        raise FileNotFoundError(f"run {str(arg)!r} is a {RESULTS} file: pass its folder, {str(given.parent)!r}")
    runs = sorted((p for p in given.iterdir() if is_run_dir(p)), key=lambda p: p.name) if given.is_dir() else []
    if runs:
        shown = ", ".join(str(p) for p in runs[-3:]) + (f" (and {len(runs) - 3} more)" if len(runs) > 3 else "")
        raise FileNotFoundError(f"run {str(arg)!r}: this looks like a results root: pass one of its run folders: "
                                f"{shown}")
    where = "" if given.is_absolute() else f", nor a run id under {str(results_dir)!r}"
    what = f"a folder without a {RESULTS}" if given.is_dir() else "no such folder"
    raise FileNotFoundError(f"run {str(arg)!r}: {what}{where}")
