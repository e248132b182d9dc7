"""Each backend's translation of the modifiers equals the spec (the float64 reference), checked on CPU.

SDPA: the float attn_mask (ALiBi + bias + mask) and the sink emulation, through torch's own SDPA in float64, its
gradients reaching sigma and the bias. flex: the score_mod on index grids and the lse sink correction through eager
flex_attention (compiled CPU flex has no return_lse; torch 2.13). FlashAttention-2: its documented softcap and
ALiBi formulas (flash-attn 2.8.3 flash_attn/flash_attn_interface.py docstrings of flash_attn_func /
flash_attn_varlen_func: "softcap: float. Anything > 0 activates softcapping attention", "alibi_slopes: (nheads,) or
(batch_size, nheads), fp32. A bias of (-alibi_slope * |i + seqlen_k - seqlen_q - j|) is added to the attention
score of query i and key j"; csrc/flash_attn/flash_api.cpp set_params_fprop: params.softcap = softmax_scale /
softcap, scale_softmax = softcap, i.e. c * tanh(scale * qk / c)). xformers: the additive tensor attn_bias.
"""

import pytest
import torch
import torch.nn.functional as F

from harness import AttentionCase, make_inputs, reference_attention
from harness.backends.flash_attn import FlashAttn2, fa2_modifier_args
from tests.unit.backends.fa2_model import fa2_documented_scores
from harness.backends.flex import flex_score_mod, sink_corrected
from harness.backends.sdpa import Sdpa, sdpa_modifier_inputs
from harness.cases import alibi_slopes
from harness.cases.masks import Causal, CausalBottomRight, KeyPadding, SlidingWindow
from harness.cases.modifiers import additive_term, alibi_bias, softcap_scores

#: eager flex on purpose (compiled CPU flex has no return_lse): its "unfused implementation" warning is expected
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

CASES = [
    AttentionCase(2, 4, 5, 8, "fp64", seq_k=7, alibi=True, mask=CausalBottomRight()),
    AttentionCase(2, 4, 7, 8, "fp64", seq_k=5, alibi=True),                          # non-causal, Sq > Sk
    AttentionCase(2, 4, 5, 8, "fp64", seq_k=6, bias="head", mask=KeyPadding((6, 2))),
    AttentionCase(2, 4, 5, 8, "fp64", kv_heads=2, bias="full", mask=Causal()),
    AttentionCase(2, 4, 6, 8, "fp64", kv_heads=2, sinks=True, mask=SlidingWindow(2, 0)),
    AttentionCase(2, 2, 5, 8, "fp64", seq_k=4, sinks=True, alibi=True, bias="full", head_dim_v=3,
                  mask=CausalBottomRight() & KeyPadding((4, 0))),                    # empty rows with a sink
]


def _leaves(inputs):
    return {n: getattr(inputs, n).clone().requires_grad_() for n in ("q", "k", "v", "sinks", "bias")
            if getattr(inputs, n) is not None}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_sdpa_float_mask_and_sink_emulation_equal_the_spec(case):
    inputs = make_inputs(case, seed=1)
    ref = reference_attention(case, inputs)
    leaves = _leaves(inputs)
    slopes = alibi_slopes(case.heads) if case.alibi else None
    float_mask = additive_term(case.mask, case.seq_q, case.seq_k, case.batch, torch.float64, "cpu", slopes)
    k, v, attn_mask = sdpa_modifier_inputs(leaves["q"], leaves["k"], leaves["v"], float_mask, leaves.get("bias"),
                                           leaves.get("sinks"))
    out = F.scaled_dot_product_attention(leaves["q"], k, v, attn_mask=attn_mask, enable_gqa=case.kv_heads != case.heads)
    out = torch.nan_to_num(out)  # SDPA math gives NaN for a row that is -inf everywhere (no sink): 0 by the spec
    torch.testing.assert_close(out, ref.out, rtol=1e-10, atol=1e-12)
    out.backward(inputs.d_out)
    for name, leaf in leaves.items():  # the sink's gradient reaches sigma through the mask column
        torch.testing.assert_close(torch.nan_to_num(leaf.grad), ref.get("d" + name), rtol=1e-9, atol=1e-11)


def test_sdpa_declares_and_refuses():
    sdpa = Sdpa()
    assert sdpa.modifiers == {"alibi", "bias", "sinks"} and sdpa.supports_head_dim_v
    reasons = sdpa.can_run(AttentionCase(1, 2, 4, 8, "fp32", softcap=30.0), torch.device("cpu"))
    assert reasons == ["sdpa does not take the softcap modifier: SDPA has no softcap argument, and c*tanh(s/c) is not "
                       "an additive attn_mask"]
    path = sdpa.modifier_path(AttentionCase(1, 2, 4, 8, "fp32", sinks=True, alibi=True, mask=Causal()))
    assert path == "attn_mask float (alibi + mask) + sink as an appended zero key/value"


@pytest.mark.parametrize("case", CASES + [AttentionCase(2, 4, 5, 8, "fp64", seq_k=7, softcap=2.0, mask=Causal())],
                         ids=lambda c: c.id)
def test_flex_score_mod_and_lse_sink_correction_equal_the_spec(case):
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    from harness.backends.flex import flex_mask_mod
    inputs = make_inputs(case, seed=2)
    ref = reference_attention(case, inputs, grads=False)
    fp32 = inputs.map(lambda t: t.float())
    mod = flex_score_mod(case.seq_q, case.seq_k, softcap=case.softcap, bias=fp32.bias, batch=case.batch,
                         alibi_slopes=alibi_slopes(case.heads) if case.alibi else None)
    block_mask = None if case.mask is None else create_block_mask(
        flex_mask_mod(case.mask, case.seq_q, case.seq_k), case.batch if case.mask.per_batch else None, None,
        case.seq_q, case.seq_k, device="cpu")
    out, aux = flex_attention(fp32.q, fp32.k, fp32.v, score_mod=mod, block_mask=block_mask, scale=case.scale,
                              enable_gqa=case.kv_heads != case.heads, return_aux=AuxRequest(lse=True))
    if case.sinks:
        out = sink_corrected(out, aux.lse, fp32.sinks)
    torch.testing.assert_close(out.double(), ref.out, rtol=1e-4, atol=1e-5)


def test_flex_score_mod_on_index_grids_is_the_spec_formula():
    sq, sk, h = 3, 5, 4
    slopes, bias = alibi_slopes(h), torch.randn(1, h, sq, sk)
    mod = flex_score_mod(sq, sk, softcap=2.0, alibi_slopes=slopes, bias=bias, batch=2)
    s = torch.randn(2, h, sq, sk) * 3
    b, hh = torch.arange(2).view(2, 1, 1, 1), torch.arange(h).view(1, h, 1, 1)
    qi, ki = torch.arange(sq).view(1, 1, sq, 1), torch.arange(sk).view(1, 1, 1, sk)
    expected = softcap_scores(s, 2.0) + alibi_bias(slopes, sq, sk) + bias
    torch.testing.assert_close(mod(s, b, hh, qi, ki), expected)


@pytest.mark.parametrize("sq, sk", [(5, 5), (3, 8), (8, 3), (1, 6)])
def test_fa2_documented_softcap_and_alibi_equal_the_spec(sq, sk):
    heads = 6  # not a power of two: the interleaved slopes
    slopes = fa2_modifier_args(30.0, alibi_slopes(heads))["alibi_slopes"]
    assert slopes.dtype == torch.float32 and slopes.shape == (heads,)  # FA2: (nheads,) fp32
    s = torch.randn(1, heads, sq, sk, dtype=torch.float64) * 40
    ours = softcap_scores(s, 30.0) + alibi_bias(alibi_slopes(heads), sq, sk, dtype=torch.float64)
    torch.testing.assert_close(fa2_documented_scores(s, softcap=30.0, alibi_slopes=slopes.double()), ours)
    assert fa2_modifier_args() == {"softcap": 0.0, "alibi_slopes": None}  # FA2's "off" values


def test_fa2_refuses_what_it_lacks_naming_the_version_that_adds_it():
    fa2, cpu = FlashAttn2(), torch.device("cpu")
    why = {m: fa2.can_run(AttentionCase(1, 2, 4, 8, "bf16", **kw), cpu) for m, kw in
           [("sinks", dict(sinks=True)), ("bias", dict(bias="head")), ("dv", dict(head_dim_v=4))]}
    assert "FlashAttention-4 adds `learnable_sink=`" in why["sinks"][0]
    assert "no bias tensor" in why["bias"][0] and "FlashAttention-3 accepts" in why["dv"][0]
    assert fa2.can_run(AttentionCase(1, 2, 4, 8, "bf16", softcap=50.0, alibi=True), cpu) == []
    assert fa2.modifier_path(AttentionCase(1, 2, 4, 8, "bf16", softcap=50.0, alibi=True)) == \
        "native softcap= + native alibi_slopes="


@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: c.id)
def test_xformers_additive_bias_equals_the_spec(case):
    pytest.importorskip("xformers.ops.fmha.attn_bias")
    from harness.backends.xformers import with_bias, xformers_additive_bias
    shape = (case.batch, case.heads, case.seq_q, case.seq_k)
    slopes = alibi_slopes(case.heads) if case.alibi else None
    constant = xformers_additive_bias(case.mask, shape, torch.float64, "cpu", slopes)
    bias = make_inputs(case).bias
    leaf = None if bias is None else bias.clone().requires_grad_()
    total = constant if leaf is None else with_bias(constant, leaf)
    assert total.stride(-2) % 8 == 0  # rows padded to 8, as xformers' kernels want
    expected = additive_term(case.mask, case.seq_q, case.seq_k, case.batch, torch.float64, "cpu", slopes)
    expected = expected + (0 if bias is None else bias)
    torch.testing.assert_close(total, expected.expand(shape))
    if leaf is not None:  # the gradient reaches the bias input, summed over the batch for a "head" bias
        total.sum().backward()
        assert torch.all(leaf.grad == (case.batch if case.bias == "head" else 1))
