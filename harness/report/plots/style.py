"""How figures look: one fixed colour and marker per backend, the Agg canvas, and where PNGs are written."""

from __future__ import annotations

import zlib
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

FIGURES_DIR = "figures"

# Fixed colours and markers for the built-in backends, so a backend looks the same in every figure and run.
_KNOWN = {
    "naive": ("#7f7f7f", "o"), "sdpa": ("#1f77b4", "s"), "sdpa-math": ("#17becf", "v"),
    "sdpa-flash": ("#d62728", "^"), "sdpa-efficient": ("#2ca02c", "D"), "sdpa-cudnn": ("#9467bd", "P"),
    "flex": ("#ff7f0e", "X"), "xformers": ("#8c564b", "p"), "flash-attn": ("#e377c2", "*"),
}
_EXTRA = ["#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354",
          "#756bb1"]
_MARKERS = ["o", "s", "^", "v", "D", "P", "X", "p", "*", "h"]


def backend_style(name: str) -> tuple[str, str]:
    """(colour, marker) of a backend: fixed for built-ins, a stable hash of the name for plugins."""
    if name in _KNOWN:
        return _KNOWN[name]
    h = zlib.crc32(name.encode())  # not hash(): that is salted per process, colours must not change between runs
    return _EXTRA[h % len(_EXTRA)], _MARKERS[(h // len(_EXTRA)) % len(_MARKERS)]


def backend_color(name: str) -> str:
    return backend_style(name)[0]


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)  # Agg canvas, no pyplot: no global state, works headless and in threads
    return fig


def save(figures: list[tuple[str, Figure]], out_dir: str | Path) -> list[Path]:
    """Write each (name, figure) as out_dir/figures/<name>.png; returns the paths."""
    target = Path(out_dir) / FIGURES_DIR
    target.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figures:
        path = target / f"{name}.png"
        fig.savefig(path)
        paths.append(path)
    return paths
