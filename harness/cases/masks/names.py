"""Short mask names (CLI, matrices, workloads, presets) and the spec each one builds for a shape."""

from __future__ import annotations

import re

from harness.cases.masks.base import And, MaskSpec
from harness.cases.masks.causal import Causal, CausalBottomRight
from harness.cases.masks.documents import Documents
from harness.cases.masks.padding import KeyPadding
from harness.cases.masks.window import SlidingWindow

#: 'windowN' (a window of N keys back, e.g. window4096 for Mistral) is accepted besides these
MASK_NAMES = ("none", "causal", "causal-br", "window", "keypad", "causal+keypad", "docs", "docs-causal")
_WINDOW_N = re.compile(r"window(\d+)")


def document_lengths(seq: int) -> tuple[int, ...]:
    """Four packed documents of unequal lengths (1/2, 1/4, 1/8 and the rest of `seq`; zero-length when tiny)."""
    lengths = [seq // 2, seq // 4, seq // 8]
    return (*lengths, seq - sum(lengths))


def parse_mask(name: str, *, batch: int, seq_k: int, seq_q: int | None = None) -> MaskSpec | None:
    """A mask from a short CLI/matrix name; windows, padding and documents get shape-derived sizes."""
    seq_q = seq_k if seq_q is None else seq_q
    fixed = {"none": None, "causal": Causal(), "causal-br": CausalBottomRight()}
    if isinstance(name, str) and name in fixed:
        return fixed[name]
    if name == "window":
        return SlidingWindow(max(1, seq_k // 4), 0)
    if window := _WINDOW_N.fullmatch(name) if isinstance(name, str) else None:
        return SlidingWindow(int(window.group(1)), 0)
    if name in ("keypad", "causal+keypad"):
        # the last batch element keeps every key, the others lose some
        lengths = tuple(max(1, seq_k - (seq_k * (batch - 1 - b)) // (2 * batch)) for b in range(batch))
        pad = KeyPadding(lengths)
        return pad if name == "keypad" else And(Causal(), pad)
    if name in ("docs", "docs-causal"):
        return Documents(document_lengths(seq_q), document_lengths(seq_k), causal=name == "docs-causal")
    raise ValueError(f"unknown mask {name!r}; allowed: {', '.join(MASK_NAMES)}, or windowN (e.g. window4096)")
