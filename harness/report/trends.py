"""The testbed's history as a run report shows it: change points of this run's keys up to it, with trend figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness.compare.changes import detect_changes, key_series, plot_trend, trend_file
from harness.compare.history import load_history
from harness.measure.stats import MIN_SEGMENT, change_points
from harness.store.run_dir import is_run_dir
from harness.store.schema import KEY

#: a report draws at most this many trend figures (the largest steps first); `history --changes` draws all
MAX_FIGURES = 12


@dataclass
class Trends:
    """What the report says about the history: how many runs, which changes, which figures."""

    testbed: str
    runs: int
    changes: pd.DataFrame = field(default_factory=pd.DataFrame)
    figures: list[Path] = field(default_factory=list)

    #: runs change-point detection needs: two segments of MIN_SEGMENT
    needed: int = 2 * MIN_SEGMENT

    @property
    def enough(self) -> bool:
        return self.runs >= self.needed


def run_trends(run_dir: Path, env: dict, out_dir: Path) -> Trends | None:
    """Change points, over the runs stored beside `run_dir` on its testbed up to it, of the keys this run holds, with
    a trend figure per changed key under out_dir/figures/trends/; None without a testbed or a folder of runs."""
    testbed, root = env.get("testbed_id"), run_dir.parent
    if not testbed or not root.is_dir() or is_run_dir(root):
        return None
    history = load_history(root)
    if history.empty or "testbed_id" not in history:
        return None
    history = history[history.testbed_id.astype(str) == str(testbed)]
    started = env.get("started")
    if started and "started" in history:  # a report rebuilt later must not show the future of its run
        history = history[history.started.astype(str) <= str(started)]
    trends = Trends(str(testbed), history.run_id.nunique())
    if not trends.enough:
        return trends
    own = set(map(tuple, history[history.run_dir == str(run_dir)][list(KEY)].astype(str).to_numpy()))
    changes = detect_changes(history, testbed=str(testbed))
    changes = changes[pd.Series([tuple(map(str, k)) in own for k in changes[list(KEY)].to_numpy()],
                                index=changes.index, dtype=bool)]
    step = changes.ratio.astype(float).map(lambda r: max(r, 1 / r))
    trends.changes = changes.loc[step.sort_values(ascending=False).index].reset_index(drop=True)
    series = key_series(history)
    for c in trends.changes.head(MAX_FIGURES).itertuples():
        key = (c.testbed_id, *(getattr(c, k) for k in KEY))
        runs_of_key = series[key]
        trends.figures.append(plot_trend(runs_of_key, change_points(runs_of_key.latency_ms.to_numpy()),
                                         f"{key[2]} {key[1]} [{key[3]}]",
                                         out_dir / "figures" / "trends" / f"{trend_file(key)}.png"))
    return trends
