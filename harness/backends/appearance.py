"""How a backend looks in every figure: its declared colour and marker, or a plugin's from a palette of its own."""

from __future__ import annotations

import zlib
from typing import Iterable

from harness.backends.registry import all_backends

#: a backend that declares no colour gets one of these: none is a built-in's (tests/unit/report/test_plots.py checks),
#: so a plugin never looks like sdpa or naive; each stands out on the figures' white at 3:1 or more (WCAG's contrast for
#: graphics: the pale mint, lavender, pink, gold and spring green a plugin could draw were 1.2-1.6:1, issue 67)
PLUGIN_COLOURS = ("#f032e6", "#469990", "#800000", "#000075", "#808000", "#c71585", "#000000", "#d2691e",
                  "#006400", "#911eb4", "#4b0082", "#2f4f4f")
#: ... and, unless it declares one, one of these markers, which no built-in uses either
PLUGIN_MARKERS = (">", "H", "8")


def contrast_on_white(colour: str) -> float:
    """WCAG 2.1's contrast ratio of `colour` against white (1 to 21)."""
    from matplotlib.colors import to_rgb
    r, g, b = (x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in to_rgb(colour))
    return 1.05 / (0.2126 * r + 0.7152 * g + 0.0722 * b + 0.05)


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
