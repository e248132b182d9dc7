"""Mask specs: materialize() against hand-written matrices, combinations, validation, pair counts."""

import pytest
import torch

from harness.cases.masks import (And, Causal, CausalBottomRight, KeyPadding, SlidingWindow, count_attended_pairs,
                           parse_mask)


def grid(rows):
    return torch.tensor(rows, dtype=torch.bool)


def test_causal_top_left_wide():
    # Sq=2 < Sk=4: query i sees keys j <= i
    assert torch.equal(Causal().materialize(2, 4)[0, 0], grid([[1, 0, 0, 0], [1, 1, 0, 0]]))


def test_causal_bottom_right_wide():
    # Sq=2 < Sk=4: query i sees keys j <= i + 2
    assert torch.equal(CausalBottomRight().materialize(2, 4)[0, 0], grid([[1, 1, 1, 0], [1, 1, 1, 1]]))


def test_causal_top_left_tall():
    assert torch.equal(Causal().materialize(4, 2)[0, 0], grid([[1, 0], [1, 1], [1, 1], [1, 1]]))


def test_causal_bottom_right_tall_has_empty_rows():
    # Sq=4 > Sk=2: query i sees j <= i - 2; the first two rows see nothing
    assert torch.equal(CausalBottomRight().materialize(4, 2)[0, 0], grid([[0, 0], [0, 0], [1, 0], [1, 1]]))


def test_causal_square_alignments_agree():
    assert torch.equal(Causal().materialize(5, 5), CausalBottomRight().materialize(5, 5))


def test_sliding_window_left_only():
    expected = grid([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]])
    assert torch.equal(SlidingWindow(1, 0).materialize(4, 4)[0, 0], expected)


def test_sliding_window_two_sided_non_square():
    # Sq=2, Sk=4, diagonal offset 2: query 0 centred on key 2, query 1 on key 3
    expected = grid([[0, 1, 1, 1], [0, 0, 1, 1]])
    assert torch.equal(SlidingWindow(1, 1).materialize(2, 4)[0, 0], expected)


def test_sliding_window_unbounded_sides():
    assert SlidingWindow(-1, -1).materialize(3, 5).all()
    assert torch.equal(SlidingWindow(-1, 0).materialize(3, 5), CausalBottomRight().materialize(3, 5))


def test_key_padding_per_batch():
    m = KeyPadding((1, 3)).materialize(2, 3, batch=2)
    assert m.shape == (2, 1, 2, 3)
    assert torch.equal(m[0, 0], grid([[1, 0, 0], [1, 0, 0]]))
    assert torch.equal(m[1, 0], grid([[1, 1, 1], [1, 1, 1]]))


def test_causal_and_padding():
    m = (Causal() & KeyPadding((2, 3))).materialize(3, 3, batch=2)
    assert torch.equal(m[0, 0], grid([[1, 0, 0], [1, 1, 0], [1, 1, 0]]))
    assert torch.equal(m[1, 0], grid([[1, 0, 0], [1, 1, 0], [1, 1, 1]]))


def test_rows_slice_equals_full():
    mask = Causal() & KeyPadding((5, 9))
    full = mask.materialize(7, 9, batch=2)
    assert torch.equal(mask.materialize(7, 9, batch=2, rows=(2, 5)), full[:, :, 2:5])


@pytest.mark.parametrize("make, match", [
    (lambda: SlidingWindow(-2, 0), "left=-2"),
    (lambda: SlidingWindow(1, 1.5), "right=1.5"),
    (lambda: KeyPadding(()), "lengths=()"),
    (lambda: KeyPadding((3, -1)), r"lengths=\(3, -1\)"),
    (lambda: And(Causal(), "causal"), "mask specs"),
    (lambda: parse_mask("diagonal", batch=1, seq_k=4), "unknown mask 'diagonal'"),
])
def test_invalid_masks_name_the_value(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_key_padding_validated_against_case():
    with pytest.raises(ValueError, match="has 2 entries; batch is 3"):
        KeyPadding((1, 2)).validate_for(3, 4, 4)
    with pytest.raises(ValueError, match="<= seq_k=4"):
        KeyPadding((1, 5)).validate_for(2, 4, 4)


@pytest.mark.parametrize("mask", [None, Causal(), CausalBottomRight(), SlidingWindow(3, 1), KeyPadding((2, 7)),
                                  Causal() & KeyPadding((2, 7))])
def test_pair_count_matches_dense(mask):
    dense = torch.ones(1, 1, 9, 7, dtype=torch.bool) if mask is None else mask.materialize(9, 7, batch=2)
    expected = int(dense.expand(2, 1, 9, 7).sum())
    assert count_attended_pairs(mask, 2, 9, 7, block=4) == expected


def test_causal_pair_counts_closed_form():
    # top-left causal on a square: n(n+1)/2 per batch element
    assert count_attended_pairs(Causal(), 3, 100, 100) == 3 * 100 * 101 // 2
