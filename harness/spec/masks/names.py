"""Short mask names (CLI, matrices, workloads) and the spec each one builds for a shape."""

from __future__ import annotations

from harness.spec.masks.base import MaskSpec
from harness.spec.masks.causal import Causal, CausalBottomRight
from harness.spec.masks.compose import And
from harness.spec.masks.padding import KeyPadding
from harness.spec.masks.window import SlidingWindow

MASK_NAMES = ("none", "causal", "causal-br", "window", "keypad", "causal+keypad")


def parse_mask(name: str, *, batch: int, seq_k: int) -> MaskSpec | None:
    """Build a mask from a short CLI/matrix name; window and padding get shape-derived defaults."""
    if name == "none":
        return None
    if name == "causal":
        return Causal()
    if name == "causal-br":
        return CausalBottomRight()
    if name == "window":
        return SlidingWindow(max(1, seq_k // 4), 0)
    if name in ("keypad", "causal+keypad"):
        # Deterministic, varied lengths: the last batch element keeps every key, others lose some.
        lengths = tuple(max(1, seq_k - (seq_k * (batch - 1 - b)) // (2 * batch)) for b in range(batch))
        pad = KeyPadding(lengths)
        return pad if name == "keypad" else And(Causal(), pad)
    raise ValueError(f"unknown mask {name!r}; allowed: {', '.join(MASK_NAMES)}")
