"""Every run under a results directory (results.csv + env.json of each) as one DataFrame, and a per-run summary."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

from harness.backends.registry import versioned_backends
from harness.store.load import load_results, refused_rows
from harness.store.run_dir import RESULTS, is_run_dir, read_env
from harness.store.run_state import incomplete
from harness.store.schema import BAD, FAIL, PASS, TIMED, loaded

#: env.json fields added to every row (a row's own non-empty value wins), with every backend's version (env_fields)
_ENV_FIELDS = ("testbed_id", "host", "device_type", "device_name", "cpu_model", "torch", "torch_git", "cuda",
               "driver", "triton", "git_sha", "git_dirty", "timing_mode", "started")


def env_fields() -> tuple[str, ...]:
    return (*_ENV_FIELDS, *versioned_backends())


def run_dirs(results_dir: str | Path) -> list[Path]:
    """Run directories directly under `results_dir` (or itself when it is one; not shards), oldest name first."""
    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"results directory {str(root)!r} does not exist")
    return [root] if is_run_dir(root) else sorted(p for p in root.iterdir() if is_run_dir(p))


def load_run(run_dir: str | Path) -> pd.DataFrame:
    """One run's rows with its env.json fields, `run_dir`, `incomplete` (why not) and `refused_rows` added."""
    run_dir = Path(run_dir)
    df, env = load_results(run_dir), read_env(run_dir)
    refused = refused_rows(df)
    df["run_id"] = df["run_id"].fillna(env.get("run_id", run_dir.name)) if "run_id" in df else run_dir.name
    for name in env_fields():
        df[name] = df[name].where(df[name].notna(), env.get(name)) if name in df.columns else env.get(name)
    why = incomplete(env) or ""
    df = df.assign(run_dir=str(run_dir), incomplete=why, refused_rows=refused, kernels=kernels_of(env))
    if df.empty and (refused or why):  # a run with no row left must still be listed, with its notes
        df = pd.DataFrame([{"run_id": env.get("run_id", run_dir.name), "run_dir": str(run_dir),
                            "incomplete": why, "refused_rows": refused,
                            **{name: env.get(name) for name in env_fields()}}])
    return df


def kernels_of(env: dict) -> str:
    """The plugin kernels a run timed, each as its module's name and its source's sha256 (env.json's
    backend_sources): what tells two versions of a kernel apart when the harness's git sha is the same."""
    return ", ".join(f"{Path(str(r.get('module'))).name}:{(r.get('sha256') or 'no source')[:8]}"
                     for r in env.get("backend_sources") or [])


def load_history(results_dir: str | Path = "results") -> pd.DataFrame:
    """All runs under `results_dir` in one frame; a run that cannot be read is skipped with a warning."""
    frames = []
    for run_dir in run_dirs(results_dir):
        try:
            frames.append(load_run(run_dir))
        except (OSError, ValueError, pd.errors.ParserError) as exc:
            warnings.warn(f"skipping run {run_dir}: {exc}", stacklevel=2)
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=["run_id", "run_dir", *env_fields()])
    return pd.concat(frames, ignore_index=True)


def summarize(history: pd.DataFrame) -> pd.DataFrame:
    """One line per run: when, where, what (its plugin kernels too), how many rows and verdicts, how many rows carry
    timings and how many of those were timed beside other load (schema.loaded)."""
    if history.empty:
        return pd.DataFrame(columns=["run_id", "started", "host", "testbed_id", "device_name", "torch", "git_sha",
                                     "kernels", "rows", "cases", "backends", PASS, FAIL, TIMED, "loaded", "refused",
                                     "complete"])
    # a run listed for its notes alone (no row yet: another machine still writing it, or every row refused) has none
    # of the rows' columns
    history = history.reindex(columns=[*history.columns, *(c for c in ("status", "case_id", "backend")
                                                          if c not in history)])
    timed = history["latency_ms"].notna() if "latency_ms" in history else pd.Series(False, index=history.index)
    busy = (timed & history["contention"].map(loaded)) if "contention" in history else timed & False
    g = history.assign(_pass=history.status.eq(PASS), _fail=history.status.isin(BAD), _timed=timed, _loaded=busy,
                       _row=history.case_id.notna()).groupby("run_dir", sort=False)
    out = pd.DataFrame({
        "run_id": g.run_id.first(), "started": g.started.first(), "host": g.host.first(),
        "testbed_id": g.testbed_id.first(), "device_name": g.device_name.first(), "torch": g.torch.first(),
        "git_sha": g.git_sha.first().astype(str).str[:8],
        "kernels": g.kernels.first().fillna("") if "kernels" in history else "",
        "rows": g._row.sum(), "cases": g.case_id.nunique(),
        "backends": g.backend.nunique(), PASS: g._pass.sum(), FAIL: g._fail.sum(), TIMED: g._timed.sum(),
        "loaded": g._loaded.sum(),
        "refused": g.refused_rows.first().fillna(0).astype(int),
        "complete": g.incomplete.first().fillna("").map(lambda why: "no" if why else "yes"),
    }).reset_index(drop=True)
    return out.sort_values("started", na_position="first").reset_index(drop=True)


def history_text(history: pd.DataFrame) -> str:
    """The summary table and one line of totals, for the terminal."""
    return summary_text(summarize(history), run_notes_lines(history))


def summary_text(runs: pd.DataFrame, notes: list[str]) -> str:
    """The per-run summary (summarize's), a line of totals and the runs' notes (run_notes_lines')."""
    if runs.empty:
        return "no runs"
    totals = (f"{len(runs)} runs, {runs.testbed_id.nunique()} testbeds, {runs.host.nunique()} hosts, "
              f"{int(runs.rows.sum())} rows, from {runs.started.min()} to {runs.started.max()}")
    return "\n".join([runs.to_string(index=False), totals, *notes])


def run_notes_lines(history: pd.DataFrame) -> list[str]:
    """One line per run that did not reach its end or had lines of its results refused."""
    if history.empty:
        return []
    lines = []
    for run_dir, g in history.groupby("run_dir", sort=False):
        run_id = g.run_id.iloc[0]
        why = g["incomplete"].iloc[0]
        refused = int(g["refused_rows"].iloc[0])
        if why:
            lines.append(f"incomplete run {run_id}: {why}; its rows are only those written until then")
        if refused:
            lines.append(f"run {run_id}: {refused} line(s) of {RESULTS} refused as unreadable ({run_dir})")
    return lines
