"""The backends' paged helpers: the gather, a paged kernel's keywords, a mixed step's packed call."""

from __future__ import annotations

from typing import Callable

import torch

from harness.cases.case import AttentionCase
from harness.cases.masks import CacheCausal, MaskSpec
from harness.cases.paged import gather_kv, mixed_step_queries

#: what the rows of a gathering backend say ran: the gather is part of every timed call
GATHER_NOTE = "gather through the block table inside the timed call"


def gather_paged(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                 cache_seqlens: torch.Tensor, mask: MaskSpec | None, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous K and V in `layout`, up to the longest cache (the case's seq_k: max of the mask's lengths, which
    equal cache_seqlens; read from the spec so the call never syncs on a device tensor)."""
    seq_k = max(mask.lengths) if isinstance(mask, CacheCausal) else int(cache_seqlens.max())
    return gather_kv(k_cache, block_table, seq_k, layout), gather_kv(v_cache, block_table, seq_k, layout)


def paged_call_args(case: AttentionCase, device) -> dict:
    """A paged kernel's keywords besides q, the caches and the page table: causal (bottom-right against each cache
    length: CacheCausal), and for a mixed step cu_seqlens_q / max_seqlen_q with `rows` (to pack q: run_packed)."""
    return {"causal": True, "rows": None, **(mixed_step_queries(case, device) if case.mask.mixed else {})}


def run_packed(q: torch.Tensor, rows: torch.Tensor, call: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """A mixed serving step: `call` on the rows of q (batch, seq_q, heads, head_dim) that carry a query (`rows`, int64
    into batch * seq_q), packed; its (tokens, heads, head_dim_v) output scattered back, padding rows 0."""
    b, sq, h, d = q.shape
    flat = q.reshape(b * sq, h, d)
    # FP8 q gathered as bytes: a gather is dtype-agnostic, whatever float8 kernels this torch dispatches
    packed = (flat.view(torch.uint8).index_select(0, rows).view(q.dtype) if q.element_size() == 1
              else flat.index_select(0, rows))
    out = call(packed)
    return out.new_zeros(b * sq, h, out.shape[-1]).index_copy_(0, rows, out).reshape(b, sq, h, out.shape[-1])
