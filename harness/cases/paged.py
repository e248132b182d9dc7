"""A case's paged KV cache (FlashAttention's layouts): shuffled block table, the caches through it, gather, checks."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from harness.cases.case import AttentionCase, Inputs

#: physical pages no sequence owns (stale data), so a kernel reading one page off reads garbage, not a neighbour
SPARE_PAGES = 2
#: seeds of the block table's shuffle and of the stale values in pages beyond every sequence's cache
TABLE_SEED, STALE_SEED = 0, 1
#: elements of the largest stale fill kept for reuse (_stale_pages): 1M, 4 MB in float32 - at most four are kept, in
#: any process that makes pages (a user's own check() too); the CPU's paged cases are 80-300K
STALE_KEPT = 2 ** 20
FORWARD_ONLY = "paged KV cases are forward-only: decode and verification take no gradients"


@dataclass(frozen=True)
class PagedLayout:
    """Where a paged case's keys live: block_table (batch, max_blocks) int32 and cache_seqlens (batch,) int32."""

    block_table: torch.Tensor
    cache_seqlens: torch.Tensor
    num_blocks: int
    page_size: int


def paged_layout(case: "AttentionCase", device: str | torch.device = "cpu") -> PagedLayout:
    """The case's block table: each sequence owns ceil(seq_k / page_size) pages of a seeded shuffle of all pages."""
    page, batch = case.page_size, case.batch
    max_blocks = math.ceil(case.seq_k / page)
    num_blocks = batch * max_blocks + SPARE_PAGES
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(TABLE_SEED))
    table = order[:batch * max_blocks].view(batch, max_blocks).to(torch.int32)
    lengths = torch.tensor(case.mask.lengths, dtype=torch.int32, device=device)
    return PagedLayout(table.to(device), lengths, num_blocks, page)


@functools.lru_cache(maxsize=4)
def _stale(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    gen = torch.Generator(device).manual_seed(STALE_SEED)
    return torch.randn(shape, generator=gen, device=device).to(dtype)


def _stale_pages(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """What the slots no sequence owns hold (seeded, the same every time): a small CPU cache's kept (a timing round
    makes its pages anew for every call, and drawing them was most of a decode key's round); a large one's, or a GPU's
    (fast to draw, and kept it would hold device memory), drawn."""
    if device == "cpu" and math.prod(shape) <= STALE_KEPT:
        return _stale(shape, dtype, device)
    return _stale.__wrapped__(shape, dtype, device)


def to_paged(x: torch.Tensor, layout: PagedLayout, into: torch.Tensor | None = None) -> torch.Tensor:
    """Canonical (batch, kv_heads, seq_k, head_dim) K or V -> the cache (num_blocks, page_size, kv_heads, head_dim);
    into: such a cache, whose sequences' slots are written in place (the others keep what they hold)."""
    b, hkv, sk, d = x.shape
    cache = into if into is not None else _stale_pages((layout.num_blocks, layout.page_size, hkv, d), x.dtype,
                                                      str(x.device)).clone()
    logical, table = x.transpose(1, 2), layout.block_table.long()            # (B, Sk, Hkv, D)
    full, rest = divmod(sk, layout.page_size)
    cache[table[:, :full]] = logical[:, :full * layout.page_size].reshape(b, full, layout.page_size, hkv, d)
    if rest:  # the last page's first `rest` slots; the slots after them keep their stale values
        cache[table[:, full], :rest] = logical[:, full * layout.page_size:]
    return cache


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_k: int, layout: str = "bhsd") -> torch.Tensor:
    """The pages in logical order: (batch, kv_heads, seq_k, head_dim) ('bhsd') or (batch, seq_k, kv_heads, ...)."""
    pages = cache[block_table.long()]                                         # (B, max_blocks, P, Hkv, D)
    logical = pages.flatten(1, 2)[:, :seq_k]                                  # (B, Sk, Hkv, D)
    return logical if layout == "bshd" else logical.transpose(1, 2)


def paged_inputs(case: "AttentionCase", k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(k_cache, v_cache, block_table, cache_seqlens) of canonical k, v for `case`, on their device."""
    layout = paged_layout(case, k.device)
    k_cache, v_cache = to_paged(k, layout), to_paged(v, layout)
    return k_cache, v_cache, layout.block_table, layout.cache_seqlens


def reference_inputs(case: "AttentionCase", inputs: "Inputs") -> "Inputs":
    """What the oracle attends for a paged case: the pages gathered back through the block table into K/V."""
    k_cache, v_cache, table, _ = paged_inputs(case, inputs.k, inputs.v)
    return inputs._replace(k=gather_kv(k_cache, table, case.seq_k), v=gather_kv(v_cache, table, case.seq_k))


def query_rows(case: "AttentionCase") -> torch.Tensor:
    """The rows of a mixed step's padded q (batch * seq_q) that carry a query, in request order (int64)."""
    return (~case.mask.padding_rows(case.seq_q)).flatten().nonzero().flatten()


def mixed_step_queries(case: "AttentionCase", device) -> dict:
    """A mixed step's packed queries for varlen kernels: cu_seqlens_q (int32), max_seqlen_q and query_rows."""
    q_lens = case.mask.q_lens
    return {"cu_seqlens_q": cu_seqlens(q_lens).to(device), "max_seqlen_q": max(q_lens),
            "rows": query_rows(case).to(device)}


def cu_seqlens(lengths) -> torch.Tensor:
    """Varlen kernels' offsets, (len(lengths) + 1,) int32: 0, then the running sum of `lengths`."""
    return torch.nn.functional.pad(torch.as_tensor(lengths).cumsum(0), (1, 0)).to(torch.int32)
