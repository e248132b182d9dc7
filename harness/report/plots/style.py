"""How figures look: each backend's colour and marker (backends/appearance.py), the Agg canvas, where PNGs go."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.backends.appearance import backend_color, backend_style  # noqa: F401 (the figures' one source)
from harness.backends.registry import label as backend_label  # a backend's name in legends

FIGURES_DIR = "figures"


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)  # Agg canvas, no pyplot: no global state, works headless and in threads
    return fig


def save(figures: list[tuple[str, Figure]], out_dir: str | Path) -> list[Path]:
    """Write each (name, figure) as out_dir/figures/<name>.png; returns the paths."""
    target = Path(out_dir) / FIGURES_DIR
    target.mkdir(parents=True, exist_ok=True)
    for name, fig in figures:
        fig.savefig(target / f"{name}.png")
    return [target / f"{name}.png" for name, _ in figures]
