"""Figures of a stored run (PNG, matplotlib Agg), built from its results only: `plot_run` draws them all."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Callable

from matplotlib.figure import Figure

from harness.report.data import Run
from harness.report.plots.metrics import METRICS, memory_figures, metric_figures, metric_rows
from harness.report.plots.roofline import bandwidth_figures, roofline_figures
from harness.report.plots.style import FIGURES_DIR, backend_color, backend_style, save
from harness.report.plots.tables import semantics_figure, support_figure

__all__ = ["FIGURE_BUILDERS", "METRICS", "backend_color", "backend_style", "metric_rows", "plot_run", "save"]

#: kind -> its figures, in the report's order; memory keeps its place among the metrics, in a unit chosen per run
FIGURE_BUILDERS: dict[str, Callable[[Run], list[tuple[str, Figure]]]] = {
    **{kind: partial(metric_figures, metric=metric) for kind, metric in METRICS.items()}, "memory": memory_figures,
    "support": support_figure, "semantics": semantics_figure, "roofline": roofline_figures,
    "bandwidth": bandwidth_figures,
}


def plot_run(run: Run, out_dir: str | Path | None = None) -> dict[str, list[Path]]:
    """Render every figure the run's data allows, in this process; {kind: [png paths]} (a kind without data maps
    to [])."""
    out_dir = Path(out_dir) if out_dir else run.run_dir
    folder = out_dir / FIGURES_DIR
    for path in folder.glob("*.png") if folder.is_dir() else []:
        if path.stem.split("-")[0] in FIGURE_BUILDERS:  # an earlier plot's figure that has no data now
            path.unlink()
    return {kind: save(build(run), out_dir) for kind, build in FIGURE_BUILDERS.items()}
