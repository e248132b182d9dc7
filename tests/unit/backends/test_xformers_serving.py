"""xformers on a mixed serving step: PagedBlockDiagonalCausalWithOffsetPaddedKeysMask with each sequence's own
q_seqlen (xformers 0.0.35, ops/fmha/attn_bias.py: query i of block b sees keys j <= kv_seqlen[b] - q_seqlen[b] + i),
materialized on the CPU and compared with the harness's CacheCausal(lengths, q_lens) read through the same block
table; and the dispatcher's choice for it on a patched sm90 (its forward needs CUDA)."""

import pytest
import torch

from harness import AttentionCase
from harness.cases.masks import CacheCausal
from harness.cases.paged import paged_layout

MIXED = AttentionCase(4, 8, 12, 128, "bf16", kv_heads=2, seq_k=45,
                      mask=CacheCausal((45, 20, 33, 27), (12, 1, 4, 1)), page_size=16)


def test_the_mixed_paged_bias_materializes_to_the_spec_over_the_physical_cache():
    pytest.importorskip("xformers.ops.fmha.attn_bias")
    from harness.backends.xformers import xformers_paged_bias

    case, table = MIXED, paged_layout(MIXED).block_table
    bias = xformers_paged_bias(case, table)
    page, max_blocks, total = case.page_size, table.shape[1], sum(case.mask.q_lens)
    dense = bias.materialize((total, case.batch * max_blocks * page))
    expected = torch.zeros(dense.shape, dtype=torch.bool)
    visible = case.mask.materialize(case.seq_q, case.seq_k, batch=case.batch)[:, 0]      # (B, Sq, Sk) logical
    row = 0
    for b, q_len in enumerate(case.mask.q_lens):
        for j in range(case.seq_k):
            physical = int(table[b, j // page]) * page + j % page
            expected[row:row + q_len, physical] = visible[b, :q_len, j]
        assert not visible[b, q_len:].any()                                               # padding rows: no key
        row += q_len
    assert torch.equal(torch.isfinite(dense), expected)


def test_the_mixed_step_packs_q_by_its_query_lengths_and_dispatches_on_sm90():
    pytest.importorskip("xformers.ops.fmha")
    from harness.backends.xformers import xformers_paged_plan
    from tests.unit.backends.test_xformers_dispatch import cuda_tensor, sm90

    with sm90(bundled_flash=False):
        form = xformers_paged_plan(MIXED, torch.device("cpu"), cuda_tensor)
    assert form.fw.NAME.startswith("fa2F") and form.rows.tolist() == (
        list(range(12)) + [12] + [24, 25, 26, 27] + [36])
