"""How figures look: one fixed colour and marker per backend, the Agg canvas, and where PNGs are written."""

from __future__ import annotations

import zlib
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.backends.registry import all_backends, label as backend_label  # a backend's name in legends

FIGURES_DIR = "figures"

# A backend that declares no colour or marker gets one from these, by a stable hash of its name.
_EXTRA = ["#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354",
          "#756bb1"]
_MARKERS = ["o", "s", "^", "v", "D", "P", "X", "p", "*", "h"]


def backend_style(name: str) -> tuple[str, str]:
    """(colour, marker) of a backend: as its class declares them (Backend.colour, .marker), else from a stable hash
    of the name (also for a backend not registered in this process, e.g. a plugin of a stored run)."""
    backend = all_backends().get(name)
    h = zlib.crc32(name.encode())  # not hash(): that is salted per process, colours must not change between runs
    colour, marker = (backend.colour, backend.marker) if backend is not None else (None, None)
    return colour or _EXTRA[h % len(_EXTRA)], marker or _MARKERS[(h // len(_EXTRA)) % len(_MARKERS)]


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
    for name, fig in figures:
        fig.savefig(target / f"{name}.png")
    return [target / f"{name}.png" for name, _ in figures]
