"""The paged path of a backend without a paged kernel: gather the pages through the block table, then attend."""

from __future__ import annotations

import torch

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
