"""Each mask's per-row key intervals (the O(seq_q) shortcut FLOP counts use at long sequences) are its `allows`."""

import random

import pytest
import torch

from harness.cases.masks import (And, Causal, CausalBottomRight, Documents, KeyPadding, SlidingWindow,
                                count_attended_pairs)
from harness.cases.masks.names import document_lengths


def _shapes(seed: int, n: int = 25):
    rng = random.Random(seed)
    return [(rng.randint(1, 3), rng.randint(1, 40), rng.randint(1, 40)) for _ in range(n)]


def _masks(batch: int, seq_q: int, seq_k: int, rng: random.Random):
    pad = KeyPadding(tuple(rng.randint(0, seq_k) for _ in range(batch)))
    docs_q, docs_k = document_lengths(seq_q), document_lengths(seq_k)
    return [Causal(), CausalBottomRight(), SlidingWindow(rng.randint(0, 9), 0), SlidingWindow(3, 2),
            SlidingWindow(-1, 1), SlidingWindow(2, -1), pad, And(Causal(), pad), And(CausalBottomRight(), pad),
            And(SlidingWindow(4, 0), pad), Documents(docs_q, docs_k), Documents(docs_q, docs_k, causal=True),
            Documents((0, seq_q), (seq_k, 0), causal=True), And(Documents(docs_q, docs_k, causal=True), pad)]


@pytest.mark.parametrize("seed", range(4))
def test_intervals_are_the_mask(seed):
    rng = random.Random(seed)
    for batch, seq_q, seq_k in _shapes(seed):
        for mask in _masks(batch, seq_q, seq_k, rng):
            ranges = mask.key_ranges(seq_q, seq_k, batch)
            assert ranges is not None, mask
            lo, hi = ranges
            k = torch.arange(seq_k).view(1, 1, -1)
            from_ranges = (k >= lo[..., None]) & (k < hi[..., None])               # (B|1, Sq, Sk)
            dense = mask.materialize(seq_q, seq_k, batch=batch)[:, 0]
            assert torch.equal(from_ranges.expand_as(dense), dense), (mask, batch, seq_q, seq_k)
            assert count_attended_pairs(mask, batch, seq_q, seq_k) == int(dense.expand(batch, -1, -1).sum())


def test_long_sequences_count_in_linear_time():
    # 64k x 64k would be 4 G mask entries; the intervals make it 64k rows
    assert count_attended_pairs(Causal(), 1, 65536, 65536) == 65536 * 65537 // 2
    # rows 0..4095 see i + 1 keys, every later row 4097 (itself and 4096 back)
    assert count_attended_pairs(SlidingWindow(4096, 0), 2, 65536, 65536) == 2 * (
        sum(range(1, 4097)) + (65536 - 4096) * 4097)
