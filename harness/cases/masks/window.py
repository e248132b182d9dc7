"""Sliding-window (local) attention with FlashAttention-2's bottom-right alignment."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.cases.masks.base import MaskSpec


@dataclass(frozen=True)
class SlidingWindow(MaskSpec):
    """Query i sees keys j with i + seq_k - seq_q - left <= j <= i + seq_k - seq_q + right (-1: unbounded side);
    `scaled_from` only labels, in the id, a window standing for a longer model window (presets.check_window)."""

    left: int
    right: int = 0
    scaled_from: int | None = field(default=None, kw_only=True)

    kind = "window"

    def __post_init__(self):
        for side in ("left", "right"):
            value = getattr(self, side)
            if not isinstance(value, int) or isinstance(value, bool) or value < -1:
                raise ValueError(f"SlidingWindow.{side}={value!r}: must be an int >= 0, or -1 for unbounded")
        if self.scaled_from is not None and (not isinstance(self.scaled_from, int) or isinstance(self.scaled_from, bool)
                                             or self.scaled_from < 1):
            raise ValueError(f"SlidingWindow.scaled_from={self.scaled_from!r}: must be an int >= 1 or None")

    @property
    def id(self) -> str:
        scaled = f"-scaled-from{self.scaled_from}" if self.scaled_from is not None else ""
        return f"window{self.left}-{self.right}{scaled}"

    def allows(self, b, q_idx, k_idx, seq_q, seq_k):
        diag = q_idx + (seq_k - seq_q)
        ok = (k_idx >= diag - self.left) if self.left >= 0 else torch.ones_like(k_idx <= diag)
        return ok & (k_idx <= diag + self.right) if self.right >= 0 else ok

    def key_ranges(self, seq_q, seq_k, batch=None):
        diag = torch.arange(seq_q).view(1, -1) + (seq_k - seq_q)
        lo = (diag - self.left).clamp(0, seq_k) if self.left >= 0 else torch.zeros_like(diag)
        hi = (diag + self.right + 1).clamp(0, seq_k) if self.right >= 0 else torch.full_like(diag, seq_k)
        return lo, hi
