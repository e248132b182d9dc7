"""Causal masks, named for their alignment: top-left (SDPA is_causal) and bottom-right (FlashAttention-2)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.spec.masks.base import MaskSpec


@dataclass(frozen=True)
class Causal(MaskSpec):
    """Top-left aligned causal: query i sees keys j <= i (SDPA is_causal, xformers LowerTriangularMask)."""

    kind = "causal"

    def allows(self, b, q_idx, k_idx, seq_q, seq_k):
        return k_idx <= q_idx


@dataclass(frozen=True)
class CausalBottomRight(MaskSpec):
    """Bottom-right aligned causal: query i sees keys j <= i + seq_k - seq_q (FlashAttention-2 >= 2.1)."""

    kind = "causal-br"

    def allows(self, b, q_idx, k_idx, seq_q, seq_k):
        return k_idx <= q_idx + (seq_k - seq_q)
