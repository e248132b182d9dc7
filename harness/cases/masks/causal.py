"""Causal masks, named for their alignment: top-left (SDPA is_causal) and bottom-right (FlashAttention-2)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.cases.masks.base import MaskSpec


@dataclass(frozen=True)
class Causal(MaskSpec):
    """Top-left aligned causal: query i sees keys j <= i (SDPA is_causal, xformers LowerTriangularMask)."""

    kind = "causal"

    def allows(self, b, q_idx, k_idx, seq_q, seq_k):
        return k_idx <= q_idx

    def key_ranges(self, seq_q, seq_k, batch=None):
        q = torch.arange(seq_q).view(1, -1)
        return torch.zeros_like(q), (q + 1).clamp_max(seq_k)


@dataclass(frozen=True)
class CausalBottomRight(MaskSpec):
    """Bottom-right aligned causal: query i sees keys j <= i + seq_k - seq_q (FlashAttention-2 >= 2.1)."""

    kind = "causal-br"

    def allows(self, b, q_idx, k_idx, seq_q, seq_k):
        return k_idx <= q_idx + (seq_k - seq_q)

    def key_ranges(self, seq_q, seq_k, batch=None):
        q = torch.arange(seq_q).view(1, -1)
        return torch.zeros_like(q), (q + (seq_k - seq_q) + 1).clamp(0, seq_k)
