"""Sliding-window (local) attention with FlashAttention-2's bottom-right alignment."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.spec.masks.base import MaskSpec


@dataclass(frozen=True)
class SlidingWindow(MaskSpec):
    """Bottom-right aligned local window, FlashAttention-2 semantics.

    Query i sees keys j with i + seq_k - seq_q - left <= j <= i + seq_k - seq_q + right;
    left/right = -1 means unbounded on that side. SlidingWindow(left, 0) is causal-bottom-right
    attention limited to the last left + 1 keys.
    """

    left: int
    right: int = 0

    kind = "window"

    def __post_init__(self):
        for side in ("left", "right"):
            value = getattr(self, side)
            if not isinstance(value, int) or isinstance(value, bool) or value < -1:
                raise ValueError(f"SlidingWindow.{side}={value!r}: must be an int >= 0, or -1 for unbounded")

    @property
    def id(self) -> str:
        return f"window{self.left}-{self.right}"

    def allows(self, b, q_idx, k_idx, seq_q, seq_k):
        diag = q_idx + (seq_k - seq_q)
        ok = torch.ones_like(k_idx <= diag)
        if self.left >= 0:
            ok = ok & (k_idx >= diag - self.left)
        if self.right >= 0:
            ok = ok & (k_idx <= diag + self.right)
        return ok

    def key_ranges(self, seq_q, seq_k, batch=None):
        diag = torch.arange(seq_q).view(1, -1) + (seq_k - seq_q)
        lo = (diag - self.left).clamp(0, seq_k) if self.left >= 0 else torch.zeros_like(diag)
        hi = (diag + self.right + 1).clamp(0, seq_k) if self.right >= 0 else torch.full_like(diag, seq_k)
        return lo, hi
