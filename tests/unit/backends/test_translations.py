"""Each backend's native mask form equals the canonical materialize(); checked on CPU, real classes where possible."""

import pytest
import torch
import torch.nn.functional as F

from harness import AttentionCase, make_inputs
from harness.backends.base import Unsupported
from harness.backends.flash_attn import fa2_args
from tests.unit.backends.fa2_model import fa2_visible
from harness.backends.flex import flex_mask_mod
from harness.backends.sdpa import sdpa_mask_args
from harness.cases.masks import Causal, CausalBottomRight, KeyPadding, SlidingWindow

SHAPES = [(5, 5), (3, 8), (8, 3), (1, 6)]
MASKS = [None, Causal(), CausalBottomRight(), SlidingWindow(2, 0), SlidingWindow(1, 2), SlidingWindow(-1, 1),
         KeyPadding((2, 3)), Causal() & KeyPadding((2, 3)), CausalBottomRight() & KeyPadding((1, 3))]


def canonical(mask, sq, sk, batch=2):
    if mask is None:
        return torch.ones(1, 1, sq, sk, dtype=torch.bool)
    return mask.materialize(sq, sk, batch=batch)


def _fits(mask, sk):
    return not (mask is not None and mask.per_batch and sk < 3)


@pytest.mark.parametrize("sq, sk", SHAPES)
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "none" if m is None else m.id)
def test_sdpa_translation_behaves_like_dense_mask(mask, sq, sk):
    if not _fits(mask, sk):
        pytest.skip("padding lengths exceed seq_k")
    case = AttentionCase(2, 2, sq, 4, "fp64", seq_k=sk, mask=mask)
    q, k, v, _ = make_inputs(case)[:4]
    kwargs = sdpa_mask_args(mask, sq, sk, 2, "cpu")
    ours = F.scaled_dot_product_attention(q, k, v, **kwargs)
    dense = canonical(mask, sq, sk)
    visible = dense.any(-1, keepdim=True)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    assert torch.allclose(ours.masked_fill(~visible, 0), expected.masked_fill(~visible, 0), atol=1e-12)


@pytest.mark.parametrize("sq, sk", SHAPES)
@pytest.mark.parametrize("mask", MASKS[1:], ids=lambda m: m.id)
def test_flex_mask_mod_equals_materialize(mask, sq, sk):
    if not _fits(mask, sk):
        pytest.skip("padding lengths exceed seq_k")
    mod = flex_mask_mod(mask, sq, sk)
    b = torch.arange(2).view(2, 1, 1, 1)
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long)
    qi = torch.arange(sq).view(1, 1, sq, 1)
    ki = torch.arange(sk).view(1, 1, 1, sk)
    assert torch.equal(mod(b, h, qi, ki).expand(2, 1, sq, sk), canonical(mask, sq, sk).expand(2, 1, sq, sk))


@pytest.mark.parametrize("sq, sk", SHAPES)
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "none" if m is None else m.id)
def test_xformers_attn_bias_materializes_to_canonical(mask, sq, sk):
    pytest.importorskip("xformers.ops.fmha.attn_bias")
    from harness.backends.xformers import xformers_bias
    if not _fits(mask, sk):
        pytest.skip("padding lengths exceed seq_k")
    shape = (2, 3, sq, sk)
    bias = xformers_bias(mask, shape)  # every mask here has an xformers form (padding: a tensor bias of the whole)
    if bias is None:
        allowed = torch.ones(shape, dtype=torch.bool)
    elif isinstance(bias, torch.Tensor):
        allowed = torch.isfinite(bias)
    else:  # the real xformers class computes its own dense form
        allowed = torch.isfinite(bias.materialize(shape, dtype=torch.float32))
    assert torch.equal(allowed, canonical(mask, sq, sk).expand(shape))


def test_xformers_gqa_bias_shape():
    pytest.importorskip("xformers.ops.fmha.attn_bias")
    from harness.backends.xformers import xformers_bias
    bias = xformers_bias(Causal() & KeyPadding((2, 4)), (2, 2, 3, 5, 4))
    assert isinstance(bias, torch.Tensor) and bias.stride(-2) % 8 == 0  # rows padded to 8, as xformers wants
    dense = torch.isfinite(bias)
    assert torch.equal(dense, (Causal() & KeyPadding((2, 4))).materialize(5, 4, batch=2).view(2, 1, 1, 5, 4)
                       .expand(2, 2, 3, 5, 4))


@pytest.mark.parametrize("sq, sk", SHAPES)
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "none" if m is None else m.id)
def test_fa2_documented_window_formula_equals_canonical(mask, sq, sk):
    if not _fits(mask, sk):
        pytest.skip("padding lengths exceed seq_k")
    try:
        args = fa2_args(mask, sq, sk)
    except Unsupported as exc:
        # only top-left causal on non-square shapes and padding combined with structure have no FA2 form
        assert (isinstance(mask, Causal) and sq != sk) or "varlen" in str(exc)
        return
    visible = fa2_visible(sq, sk, **args)
    assert torch.equal(visible.expand(2, 1, sq, sk), canonical(mask, sq, sk).expand(2, 1, sq, sk))


def test_fa2_decode_step_causal_sees_every_key():
    # FA2 turns causal off for seq_q == 1; bottom-right causal agrees: the one query sees all keys
    assert fa2_visible(1, 9, **fa2_args(CausalBottomRight(), 1, 9)).all()
