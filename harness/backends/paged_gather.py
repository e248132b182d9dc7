"""Helpers of the backends' paged paths: the gather (for a backend without a paged kernel), and the case a direct
paged call describes."""

from __future__ import annotations

import torch

from harness.spec.case import AttentionCase
from harness.spec.masks import CacheCausal, MaskSpec
from harness.spec.paged import gather_kv

#: what the rows of a gathering backend say ran: the gather is part of every timed call
GATHER_NOTE = "gather through the block table inside the timed call"


def gather_paged(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                 cache_seqlens: torch.Tensor, mask: MaskSpec | None, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous K and V in `layout`, up to the longest cache (the case's seq_k: max of the mask's lengths, which
    equal cache_seqlens; read from the spec so the call never syncs on a device tensor)."""
    seq_k = max(mask.lengths) if isinstance(mask, CacheCausal) else int(cache_seqlens.max())
    return gather_kv(k_cache, block_table, seq_k, layout), gather_kv(v_cache, block_table, seq_k, layout)


def paged_case_of(q: torch.Tensor, k_cache: torch.Tensor, mask: MaskSpec, scale: float) -> AttentionCase:
    """The paged case a direct call describes (q canonical (batch, heads, seq_q, head_dim), the cache (num_blocks,
    page_size, kv_heads, head_dim)), for backends that prepare state when forward is called without `prepared`."""
    if not isinstance(mask, CacheCausal):
        raise ValueError(f"a paged call needs mask=CacheCausal(lengths); got {getattr(mask, 'id', mask)!r}")
    b, h, sq, d = q.shape
    return AttentionCase(b, h, sq, d, q.dtype, kv_heads=k_cache.shape[2], seq_k=max(mask.lengths), mask=mask,
                         scale=scale, page_size=k_cache.shape[1])
