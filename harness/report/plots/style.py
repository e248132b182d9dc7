"""How figures look: one fixed colour and marker per backend, the Agg canvas, and where PNGs are written."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Iterable

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.backends.registry import all_backends, label as backend_label  # a backend's name in legends

FIGURES_DIR = "figures"

#: a backend that declares no colour gets one of these: none is a built-in's (tests/unit/report/test_plots.py checks),
#: so a plugin never looks like sdpa or naive
PLUGIN_COLOURS = ("#f032e6", "#469990", "#800000", "#000075", "#808000", "#e6beff", "#000000", "#ffd700",
                  "#aaffc3", "#911eb4", "#fabebe", "#00ff7f")
#: ... and, unless it declares one, one of these markers, which no built-in uses either
PLUGIN_MARKERS = (">", "H", "8")


def backend_style(name: str, among: Iterable[str] = ()) -> tuple[str, str]:
    """(colour, marker) of a backend: as its class declares them (Backend.colour, .marker), else from a stable hash
    of the name (also for a backend not registered in this process, e.g. a plugin of a stored run).

    `among`: the other backends drawn with it (a run's). Undeclared colours are then handed out in name order, each
    taking its hash's slot or the next one free, so two plugins of one run never share a colour and the same
    backends get the same colours in every run and every figure."""
    registry = all_backends()
    backend = registry.get(name)
    colour, marker = (backend.colour, backend.marker) if backend is not None else (None, None)
    h = zlib.crc32(name.encode())  # not hash(): that is salted per process, colours must not change between runs
    marker = marker or PLUGIN_MARKERS[(h // len(PLUGIN_COLOURS)) % len(PLUGIN_MARKERS)]
    if colour:
        return colour, marker
    slots: dict[str, int] = {}
    for other in sorted({name, *among}):
        declared = registry.get(other)
        if declared is None or not declared.colour:
            slot = zlib.crc32(other.encode()) % len(PLUGIN_COLOURS)
            while slot in slots.values() and len(slots) < len(PLUGIN_COLOURS):
                slot = (slot + 1) % len(PLUGIN_COLOURS)
            slots[other] = slot
    return PLUGIN_COLOURS[slots[name]], marker


def backend_color(name: str, among: Iterable[str] = ()) -> str:
    return backend_style(name, among)[0]


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
