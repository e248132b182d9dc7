"""Change points in a testbed's history, per key, with the runs on each side; and a trend figure per key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from harness.backends.appearance import backend_color  # the backend's colour in every other figure
from harness.measure.stats import MIN_RUN_CHANGE, MIN_SEGMENT, PENALTY, change_points, counts_as_change
from harness.store.schema import KEY, LOADED_SHARE

SIDES = ("started", "run_id", "git_sha", "torch", "backend_version")
CHANGE_COLUMNS = ("testbed_id", *KEY, "runs", "at_run", "before_ms", "after_ms", "ratio",
                  *(f"{s}_{side}" for side in ("before", "after") for s in SIDES))


@dataclass
class TimedRuns:
    """A history's timed runs, one row per key and run id, each key's rows together, oldest run first: its keys
    (testbed, case, backend, phase) in order of first appearance, key i's rows at bounds[i]:bounds[i + 1]."""

    frame: pd.DataFrame
    keys: list[tuple]
    bounds: np.ndarray
    #: key-runs left out as loaded (schema.loaded: timed beside other load), unless asked for
    loaded_left_out: int = 0

    def items(self, only=None):
        """(key, its runs as a frame) of every key, or of the keys in `only`."""
        for i, key in enumerate(self.keys):
            if only is None or key in only:
                yield key, self.frame.iloc[self.bounds[i]:self.bounds[i + 1]].reset_index(drop=True)


def timed_runs(history: pd.DataFrame | TimedRuns, include_loaded: bool = False) -> TimedRuns:
    """The timed runs of `history`, grouped by key at once (one sort, not a frame per key); a key's run timed beside
    other load (schema.loaded) is left out unless `include_loaded` - a 0.3 ms key read 38-77 ms under load, and
    change points then reported the load, not the code (issue 67)."""
    if isinstance(history, TimedRuns):
        return history
    timed = history[pd.to_numeric(history.get("latency_ms"), errors="coerce") > 0].copy()
    busy = (pd.to_numeric(timed["contention"], errors="coerce") > LOADED_SHARE) if "contention" in timed else \
        pd.Series(False, index=timed.index)
    left_out = 0 if include_loaded else int(busy.sum())
    if left_out:
        timed = timed[~busy]
    if timed.empty:
        return TimedRuns(timed, [], np.zeros(1, dtype=np.int64), left_out)
    timed["latency_ms"] = timed.latency_ms.astype(float)
    # a key's last row of each run id, oldest run first (dropped across keys at once: one pass, not one per key)
    timed = timed.sort_values(["started", "run_id"], na_position="first").drop_duplicates(
        ["testbed_id", *KEY, "run_id"], keep="last")
    # numbered in order of first appearance, as groupby(sort=False) iterates; a key with a missing part (-1) is none
    codes = timed.groupby(["testbed_id", *KEY], sort=False, observed=True).ngroup().to_numpy()
    order = np.argsort(codes, kind="stable")
    order = order[codes[order] >= 0]
    timed, codes = timed.iloc[order].reset_index(drop=True), codes[order]
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]]) if len(codes) else np.zeros(0, dtype=np.int64)
    keys = list(timed.iloc[starts][["testbed_id", *KEY]].itertuples(index=False, name=None))
    return TimedRuns(timed, keys, np.r_[starts, len(timed)].astype(np.int64), left_out)


def key_series(history: pd.DataFrame | TimedRuns) -> dict[tuple, pd.DataFrame]:
    """(testbed, case, backend, phase) -> its timed runs in start order (one row per run)."""
    return dict(timed_runs(history).items())


def detect_changes(history: pd.DataFrame | TimedRuns, *, testbed: str | None = None, penalty: float = PENALTY,
                   min_effect: float = MIN_RUN_CHANGE) -> pd.DataFrame:
    """One row per change point of every key (of `testbed`, or all): the step and the runs on each side."""
    if testbed is not None and not isinstance(history, TimedRuns):
        history = history[history.testbed_id.astype(str) == testbed]
    timed, rows = timed_runs(history), []
    latency = timed.frame.latency_ms.to_numpy()
    for i, key in enumerate(timed.keys):
        if testbed is not None and str(key[0]) != testbed:
            continue
        first = timed.bounds[i]
        ms = latency[first:timed.bounds[i + 1]]
        bounds = [0, *change_points(ms, penalty), len(ms)]
        for left, at, right in zip(bounds, bounds[1:], bounds[2:]):
            before, after = float(np.median(ms[left:at])), float(np.median(ms[at:right]))
            if not counts_as_change(before, after, after / before, 1 + min_effect):
                continue
            sides = {f"{s}_{side}": timed.frame.iloc[first + j].get(s) for side, j in (("before", at - 1),
                                                                                        ("after", at)) for s in SIDES}
            rows.append({"testbed_id": key[0], **dict(zip(KEY, key[1:])), "runs": len(ms), "at_run": at,
                         "before_ms": before, "after_ms": after, "ratio": after / before, **sides})
    return pd.DataFrame(rows, columns=list(CHANGE_COLUMNS))


def runs_needed(history: TimedRuns) -> str:
    """How many runs a key needs to be searched for change points, and how many the keys have (issue 67)."""
    counts = np.diff(history.bounds) if history.keys else np.zeros(0, dtype=np.int64)
    need = 2 * MIN_SEGMENT
    loaded = (f"; {history.loaded_left_out} key-run(s) timed beside other load (contention over "
              f"{LOADED_SHARE:.0%}) left out: --include-loaded keeps them") if history.loaded_left_out else ""
    if not len(counts):
        return f"a key is searched from {need} timed runs on; there are none{loaded}"
    short = int((counts < need).sum())
    return (f"a key is searched from {need} timed runs on; the keys have {int(counts.min())}-{int(counts.max())}"
            + (f" ({short} key(s) too few yet)" if short else "") + loaded)


def changes_text(changes: pd.DataFrame, keys: int, needed: str = "") -> str:
    """The change points in words, each with the runs (and kernel versions: backend_version) on either side;
    `needed`: runs_needed's line."""
    note = f" ({needed})" if needed else ""
    if changes.empty:
        return f"no change points in {keys} key(s){note}"
    lines = [f"{len(changes)} change point(s) in {changes[list(KEY)].drop_duplicates().shape[0]} of {keys} "
             f"key(s){note}:"]
    for c in changes.itertuples():
        sha = lambda v: str(v)[:8] if isinstance(v, str) else "?"  # noqa: E731
        lines.append(f"  {c.backend} {c.case_id} [{c.phase}] on {c.testbed_id}: {c.before_ms:.4g} -> "
                     f"{c.after_ms:.4g} ms ({c.ratio:.2f}x) between run {c.run_id_before} ({c.started_before}, "
                     f"{sha(c.git_sha_before)}, torch {c.torch_before}, {c.backend_version_before}) and run "
                     f"{c.run_id_after} ({c.started_after}, {sha(c.git_sha_after)}, torch {c.torch_after}, "
                     f"{c.backend_version_after})")
    return "\n".join(lines)


def trend_file(key: tuple) -> str:
    """A file name (no suffix) for the trend figure of a (testbed, case, backend, phase) key."""
    return "-".join(str(k) for k in key).replace("/", "_").replace("+", "_")


def plot_trend(runs: pd.DataFrame, change_at: list[int], title: str, path: str | Path) -> Path:
    """Latency over runs (oldest left) in the backend's colour, each segment's median as a line, change points as
    vertical lines."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure


    fig = Figure(figsize=(8, 3), layout="tight")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x, ms = np.arange(len(runs)), runs.latency_ms.to_numpy(float)
    ax.plot(x, ms, "o-", ms=3, lw=0.8, color=backend_color(str(runs.backend.iloc[0])))
    bounds = [0, *change_at, len(ms)]
    for left, right in zip(bounds, bounds[1:]):
        ax.hlines(np.median(ms[left:right]), left, right - 1, color="tab:gray", lw=1.5)
    for at in change_at:
        ax.axvline(at - 0.5, color="tab:red", lw=1, ls="--")
    labels = [f"{str(s)[:10]}\n{str(g)[:7]}" for s, g in zip(runs.started, runs.get("git_sha", [""] * len(runs)))]
    step = max(1, len(x) // 8)
    ax.set_xticks(x[::step], labels[::step], fontsize=6)
    ax.set_ylabel("median latency (ms)")
    ax.set_title(title, fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def write_trends(history: pd.DataFrame | TimedRuns, changes: pd.DataFrame, out_dir: str | Path, *, every_key: bool = False,
                 penalty: float = PENALTY) -> Path:
    """A trend figure per changed key (every key with `every_key`) under out_dir, and trends.md, returned."""
    out_dir = Path(out_dir)
    changed = set(map(tuple, changes[["testbed_id", *KEY]].to_numpy())) if len(changes) else set()
    lines = ["# Latency over runs, per key", "", "Dashed red: a change point (history/changes.py).", ""]
    for key, runs in timed_runs(history).items(None if every_key else changed):
        at = change_points(runs.latency_ms.to_numpy(), penalty)
        png = plot_trend(runs, at, f"{key[2]} {key[1]} [{key[3]}] on {key[0]}", out_dir / f"{trend_file(key)}.png")
        lines += [f"## {key[2]} {key[1]} [{key[3]}] on {key[0]}", "", f"![trend]({png.name})", ""]
    if len(lines) == 4:
        lines.append("No key changed; `history --changes --all-trends` draws every key.")
    index = out_dir / "trends.md"
    out_dir.mkdir(parents=True, exist_ok=True)
    index.write_text("\n".join(lines) + "\n")
    return index
