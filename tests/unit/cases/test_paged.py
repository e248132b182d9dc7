"""The paged KV case: CacheCausal's semantics, the shuffled block table, the cache round trip and one-line errors."""

import pytest
import torch

from harness import AttentionCase
from harness.cases.masks import CacheCausal, CausalBottomRight, KeyPadding
from harness.cases.paged import gather_kv, paged_inputs, paged_layout, to_paged


def _case(seq_q=4, lengths=(45, 20, 33), page=16, **kw):
    return AttentionCase(len(lengths), 4, seq_q, 32, "fp32", kv_heads=2, seq_k=max(lengths),
                         mask=CacheCausal(lengths), page_size=page, **kw)


def test_cache_causal_aligns_each_sequence_to_its_own_length():
    mask = CacheCausal((10, 6))
    dense = mask.materialize(3, 10, batch=2)[:, 0]
    for b, n in enumerate((10, 6)):
        for i in range(3):
            assert dense[b, i].nonzero().flatten().tolist() == list(range(n - 3 + i + 1))
    # what CausalBottomRight & KeyPadding gives instead: aligned to seq_k, so the shorter cache's rows differ
    other = (CausalBottomRight() & KeyPadding((10, 6))).materialize(3, 10, batch=2)[:, 0]
    assert torch.equal(dense[0], other[0]) and not torch.equal(dense[1], other[1])


def test_cache_causal_key_ranges_match_the_predicate():
    mask = CacheCausal((9, 5, 7))
    lo, hi = mask.key_ranges(3, 9, 3)
    dense = mask.materialize(3, 9, batch=3)[:, 0]
    assert torch.equal(dense.sum(-1), (hi - lo).clamp_min(0))


def test_paged_case_id_shows_the_page_size_and_lengths():
    assert _case().id == "fp32-b3-h4kv2-s4x45-d32-cache-causal45_20_33-page16"
    long = CacheCausal(tuple(range(100, 164)))
    assert len(long.id) < 40 and long.id != CacheCausal(tuple(range(101, 165))).id


def test_block_table_is_a_shuffle_and_the_cache_round_trips():
    case = _case()
    layout = paged_layout(case)
    table = layout.block_table
    assert table.dtype == torch.int32 and table.shape == (3, 3)
    assert len(set(table.flatten().tolist())) == 9 and layout.num_blocks == 11
    assert table.flatten().tolist() != sorted(table.flatten().tolist())       # not in logical order
    k = torch.randn(3, 2, 45, 32)
    cache = to_paged(k, layout)
    assert cache.shape == (11, 16, 2, 32)
    assert torch.equal(gather_kv(cache, table, 45), k)
    assert torch.equal(gather_kv(cache, table, 45, "bshd"), k.transpose(1, 2))
    # the slots after seq_k in the last page hold stale values, not zeros
    assert cache[table[0, 2].long(), 45 - 32:].abs().sum() > 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(page=0), "page_size=0: must be an int >= 1"),
    (dict(page=2.5), "page_size=2.5"),
    (dict(lengths=(45, 20, 2)), r"each must be >= seq_q=4"),
])
def test_bad_paged_cases_get_one_line_errors(kwargs, match):
    with pytest.raises(ValueError, match=match) as err:
        _case(**kwargs)
    assert "\n" not in str(err.value)


def test_paged_case_needs_cache_lengths_in_its_mask():
    with pytest.raises(ValueError, match="needs mask=CacheCausal"):
        AttentionCase(2, 4, 1, 32, "fp32", seq_k=40, mask=CausalBottomRight(), page_size=16)
    with pytest.raises(ValueError, match="seq_k=50: a paged case's seq_k is its longest cache"):
        AttentionCase(2, 4, 1, 32, "fp32", seq_k=50, mask=CacheCausal((40, 30)), page_size=16)


@pytest.mark.parametrize("modifier", [dict(softcap=30.0), dict(sinks=True), dict(alibi=True), dict(bias="head"),
                                      dict(head_dim_v=16)])
def test_paged_cases_take_no_modifiers_yet_in_one_line(modifier):
    with pytest.raises(ValueError, match="paged cases take no modifiers and no head_dim_v yet") as err:
        AttentionCase(2, 4, 1, 32, "fp32", seq_k=40, mask=CacheCausal((40, 30)), page_size=16, **modifier)
    assert "\n" not in str(err.value)


def test_a_paged_workload_of_a_model_with_modifiers_is_refused():
    from harness.advisor.workload import Workload

    with pytest.raises(ValueError, match="paged cases take no modifiers and no head_dim_v yet; got modifiers sink"):
        Workload(4, 64, 1, 64, kv_heads=8, seq_k=512, dtype="fp32", sinks=True, page_size=16)


def test_a_kept_stale_fill_is_the_seeded_one_and_every_cache_owns_its_copy():
    """paged._stale_pages: a small cache's stale slots come from a fill kept for reuse (a timing round makes its pages
    for every call); it is what the seed draws, and writing into one cache leaves the next as seeded."""
    from harness.cases import paged

    case = AttentionCase(2, 4, 1, 32, "fp32", seq_k=40, mask=CacheCausal((40, 30)), page_size=16)
    k = torch.randn(2, 4, 40, 32)
    first = paged.to_paged(k, paged.paged_layout(case))
    kept = paged._stale_pages(tuple(first.shape), torch.float32, "cpu")
    assert torch.equal(kept, paged._stale.__wrapped__(tuple(first.shape), torch.float32, "cpu"))
    first.fill_(7.0)
    layout = paged.paged_layout(case)
    spare = sorted(set(range(layout.num_blocks)) - set(layout.block_table.flatten().tolist()))
    assert spare and torch.equal(paged.to_paged(k, layout)[spare], kept[spare])  # no sequence's: stale, as seeded


def test_pages_written_in_place_are_the_cache_made_anew():
    """paged.to_paged(into=): a cache made once, then written in place with another K (a timing round's call content),
    holds bit for bit the cache made anew from that K - its sequences' slots the new values, the slots no sequence
    owns (spare pages, a last page's tail) as they were made."""
    from harness.cases import paged

    case = AttentionCase(2, 4, 1, 32, "fp32", seq_k=40, mask=CacheCausal((40, 30)), page_size=16)
    layout = paged.paged_layout(case)
    cache = paged.to_paged(torch.randn(2, 4, 40, 32), layout)
    k = torch.randn(2, 4, 40, 32)
    assert paged.to_paged(k, layout, into=cache) is cache
    assert torch.equal(cache, paged.to_paged(k, layout))
