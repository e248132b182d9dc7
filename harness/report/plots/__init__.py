"""Figures of a stored run (PNG, matplotlib Agg), built from its results only: `plot_run` draws them all."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from matplotlib.figure import Figure

from harness.report.plots.metrics import (METRICS, Metric, err_ratio_figures, latency_figures, memory_figures,
                                  metric_figures, metric_rows, speedup_figures, tflops_figures)
from harness.report.plots.style import FIGURES_DIR, backend_color, backend_style, save
from harness.report.plots.roofline import bandwidth_figures, roofline_figures
from harness.report.plots.tables import semantics_figure, support_figure
from harness.report.data import Run

__all__ = ["FIGURE_BUILDERS", "METRICS", "Metric", "backend_color", "backend_style", "metric_figures",
           "metric_rows", "plot_err_ratio", "plot_latency", "plot_memory", "plot_run",
           "plot_semantics", "plot_speedup", "plot_support", "plot_tflops", "save"]

FIGURE_BUILDERS: dict[str, Callable[[Run], list[tuple[str, Figure]]]] = {
    "latency": latency_figures, "speedup": speedup_figures, "memory": memory_figures, "tflops": tflops_figures,
    "err_ratio": err_ratio_figures, "support": support_figure, "semantics": semantics_figure,
    "roofline": roofline_figures, "bandwidth": bandwidth_figures,
}


def _plotter(kind: str) -> Callable[[Run, str | Path], list[Path]]:
    def plot(run: Run, out_dir: str | Path) -> list[Path]:
        return _draw(FIGURE_BUILDERS[kind], run, out_dir)
    plot.__name__ = f"plot_{kind}"
    plot.__doc__ = f"Write the {kind} figure(s) of `run` under out_dir/figures/; returns the PNG paths."
    return plot


plot_latency = _plotter("latency")
plot_speedup = _plotter("speedup")
plot_memory = _plotter("memory")
plot_tflops = _plotter("tflops")
plot_err_ratio = _plotter("err_ratio")
plot_support = _plotter("support")
plot_semantics = _plotter("semantics")


def plot_run(run: Run, out_dir: str | Path | None = None) -> dict[str, list[Path]]:
    """Render every figure the run's data allows, in this process; {kind: [png paths]} (a kind without data maps
    to [])."""
    out_dir = Path(out_dir) if out_dir else run.run_dir
    _remove_stale(out_dir)
    return {kind: _draw(build, run, out_dir) for kind, build in FIGURE_BUILDERS.items()}


def _draw(build: Callable[[Run], list[tuple[str, Figure]]], run: Run, out_dir: Path) -> list[Path]:
    """One kind's figures, built and written."""
    return save(build(run), out_dir)


def _remove_stale(out_dir: Path) -> None:
    """Drop PNGs an earlier plot of this run wrote, so a figure that no longer has data does not linger."""
    folder = out_dir / FIGURES_DIR
    for path in folder.glob("*.png") if folder.is_dir() else []:
        if path.stem.split("-")[0] in FIGURE_BUILDERS:
            path.unlink()

