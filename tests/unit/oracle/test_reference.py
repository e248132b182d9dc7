"""The float64 reference: a case worked by hand, chunking, gradients against gradcheck, empty rows."""

import math

import pytest
import torch

from harness import AttentionCase, Inputs, make_inputs, reference_attention
from harness.cases.masks import CacheCausal, Causal, CausalBottomRight, KeyPadding, SlidingWindow


def test_three_tokens_by_hand():
    # q = k: 3 tokens, 2 dims, scale 1, causal. Scores q_i . k_j with e0=(1,0), e1=(0,1), e2=(1,1).
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]).view(1, 1, 3, 2)
    v = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]]).view(1, 1, 3, 2)
    case = AttentionCase(1, 1, 3, 2, "fp64", mask=Causal(), scale=1.0)
    out = reference_attention(case, Inputs(x, x, v, torch.zeros_like(x)), grads=False).out[0, 0]
    # row 0 sees key 0 only -> v0
    assert torch.allclose(out[0], torch.tensor([1.0, 0.0], dtype=torch.float64))
    # row 1: scores (0, 1) -> weights (1, e)/(1+e)
    w = torch.tensor([1.0, math.e], dtype=torch.float64) / (1 + math.e)
    assert torch.allclose(out[1], w[0] * v[0, 0, 0].double() + w[1] * v[0, 0, 1].double())
    # row 2: scores (1, 1, 2) -> weights (e, e, e^2)/(2e + e^2)
    w = torch.tensor([math.e, math.e, math.e ** 2], dtype=torch.float64) / (2 * math.e + math.e ** 2)
    assert torch.allclose(out[2], (w.view(3, 1) * v[0, 0].double()).sum(0))


@pytest.mark.parametrize("mask", [None, Causal(), CausalBottomRight(), SlidingWindow(5, 2), KeyPadding((3, 40)),
                                  Causal() & KeyPadding((20, 9))])
def test_chunked_equals_unchunked(mask):
    case = AttentionCase(2, 4, 37, 16, "fp32", kv_heads=2, seq_k=40 if mask is None or mask.per_batch else 29,
                         mask=mask)
    inputs = make_inputs(case, seed=1)
    whole = reference_attention(case, inputs, block=10_000)
    chunked = reference_attention(case, inputs, block=5)
    assert whole.dsinks is whole.dbias is chunked.dsinks is chunked.dbias is None  # a case without modifiers
    for a, b in zip(whole[:4], chunked[:4]):
        assert torch.allclose(a, b, atol=1e-12, rtol=0)


def _dense_autograd(case, inputs):
    """Independent dense float64 attention through autograd, for comparison."""
    g = case.heads // case.kv_heads
    q, k, v = (t.double().requires_grad_() for t in inputs[:3])
    s = (q @ k.repeat_interleave(g, 1).transpose(-1, -2)) * case.scale
    if case.mask is not None:
        s = s.masked_fill(~case.key_mask(), float("-inf"))
    out = torch.softmax(s, -1) @ v.repeat_interleave(g, 1)
    out.backward(inputs.d_out.double())
    return out, q.grad, k.grad, v.grad


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_gradients_match_autograd(kv_heads):
    case = AttentionCase(2, 4, 11, 8, "fp32", kv_heads=kv_heads, seq_k=13, mask=SlidingWindow(6, 3))
    inputs = make_inputs(case, seed=2)
    ours = reference_attention(case, inputs)
    for a, b in zip(ours, _dense_autograd(case, inputs)):
        assert torch.allclose(a, b, atol=1e-12, rtol=1e-10)


class _RefFn(torch.autograd.Function):
    """The reference as an autograd function whose backward is our hand-written gradient."""

    @staticmethod
    def forward(ctx, q, k, v, case):
        ctx.save_for_backward(q, k, v)
        ctx.case = case
        return reference_attention(case, Inputs(q, k, v, torch.zeros_like(q)), grads=False).out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v = ctx.saved_tensors
        ref = reference_attention(ctx.case, Inputs(q, k, v, d_out), block=3)
        return ref.dq, ref.dk, ref.dv, None


#: CacheCausal with per-sequence query lengths (a mixed serving step over a contiguous cache): sequence 0 a 5-token
#: chunk over 6 keys, sequence 1 two tokens over 4 keys, its rows 2..4 padding that sees no key
@pytest.mark.parametrize("mask", [None, Causal(), CausalBottomRight(), KeyPadding((2, 6)), CacheCausal((6, 4), (5, 2))])
def test_gradcheck(mask):
    case = AttentionCase(2, 2, 5, 3, "fp64", kv_heads=1, seq_k=6, mask=mask, scale=0.7)
    q, k, v, _ = make_inputs(case, seed=5)[:4]
    args = [t.clone().requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(lambda a, b, c: _RefFn.apply(a, b, c, case), args)


def test_rows_without_keys_are_zero_with_zero_gradient():
    # Sq > Sk bottom-right: the first 3 query rows see no key
    case = AttentionCase(1, 2, 5, 4, "fp32", seq_k=2, mask=CausalBottomRight())
    ref = reference_attention(case, make_inputs(case))
    assert torch.all(ref.out[:, :, :3] == 0) and torch.all(ref.dq[:, :, :3] == 0)
    assert torch.isfinite(ref.out).all() and torch.isfinite(ref.dk).all()
    assert ref.out[:, :, 3:].abs().sum() > 0


def test_long_sequence_memory_is_blocked():
    from harness.oracle.reference import DEFAULT_BUDGET_BYTES, block_rows
    case = AttentionCase(1, 1, 32768, 128, "fp64")
    # the two score-sized float64 buffers of a block stay in the budget: never seq_q x seq_k
    assert 2 * block_rows(case) * case.seq_k * 8 <= DEFAULT_BUDGET_BYTES < case.seq_q * case.seq_k * 8


@pytest.mark.parametrize("mask", [None, Causal(), KeyPadding((9, 5))], ids=["none", "causal", "keypad"])
def test_device_path_is_the_cpu_path(mask):
    """The reference runs on the inputs' device or the one named, with the block a GPU budget picks (no CPU cap):
    the same code as the CPU path, so on CPU the two agree to float64 rounding. On the meta device every op stays
    on the named device (nothing is pinned to the CPU inside): shapes and dtype come out, no data."""
    from harness.oracle.reference import CPU_MAX_BLOCK, block_rows
    case = AttentionCase(2, 4, 9, 16, "bf16", kv_heads=2, mask=mask)
    inputs = make_inputs(case, "cpu", seed=1)
    cpu = reference_attention(case, inputs)
    gpu_block = block_rows(case, budget_bytes=2 ** 30, device="cuda")
    named = reference_attention(case, inputs, device="cpu", block=gpu_block)
    for a, b in zip(cpu[:4], named[:4]):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
    big = AttentionCase(1, 1, 4096, 128, "fp32")
    assert block_rows(big, budget_bytes=2 ** 30, device="cuda") == 4096 > CPU_MAX_BLOCK == block_rows(big, 2 ** 30)
    meta = reference_attention(case, inputs, device="meta")
    assert [(t.device.type, t.dtype, t.shape) for t in meta[:4]] == [("meta", torch.float64, t.shape) for t in cpu[:4]]
    assert [t.device.type for t in named.to("meta")[:4]] == ["meta"] * 4


def _dense_terms(case, inputs):
    """Reference.terms by an independent dense float64 formula: per dQ row and per dK row, the root-sum-square over
    what it sums of P * dP and P * delta (each weighted by the row of K or Q it multiplies), as an RMS over the head
    dim, times the scale."""
    g = case.heads // case.kv_heads
    q, d_out = inputs.q.double(), inputs.d_out.double()
    k, v = (t.double().repeat_interleave(g, 1) for t in (inputs.k, inputs.v))
    s = (q @ k.transpose(-1, -2)) * case.scale
    if case.mask is not None:
        s = s.masked_fill(~case.key_mask(), float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    d_p = d_out @ v.transpose(-1, -2)
    delta = (d_out * (p @ v)).sum(-1, keepdim=True)
    w = p.square() * (d_p.square() + delta.square())                            # (B, H, Sq, Sk)
    dq = (w @ k.square().sum(-1, keepdim=True)).max()
    per_key = (w.transpose(-1, -2) @ q.square().sum(-1, keepdim=True))          # (B, H, Sk, 1)
    dk = per_key.view(case.batch, case.kv_heads, g, case.seq_k).sum(2).max()  # a kv head sums its group's heads
    return {"dq": case.scale * float(dq / case.head_dim) ** 0.5, "dk": case.scale * float(dk / case.head_dim) ** 0.5}


@pytest.mark.parametrize("case", [AttentionCase(2, 6, 23, 16, "fp32", kv_heads=2, seq_k=19, mask=Causal()),
                                  AttentionCase(1, 3, 193, 8, "fp32", kv_heads=1, seq_k=1),
                                  AttentionCase(2, 4, 9, 8, "bf16", seq_k=30, mask=SlidingWindow(4, 2))],
                         ids=lambda c: c.id)
def test_cancelling_terms_match_a_dense_formula(case):
    """The size of the terms dq and dk sum before the softmax backward cancels them (verdict's floor), blocked as
    the reference is (block=5 spans blocks; GQA sums a group's heads), against a dense float64 formula."""
    inputs = make_inputs(case, seed=3)
    ref = reference_attention(case, inputs, block=5)
    for quantity, expected in _dense_terms(case, inputs).items():
        assert ref.terms_of(quantity) == pytest.approx(expected, rel=1e-9)
    assert ref.terms_of("dv") == ref.terms_of("out") == 0.0 and reference_attention(case, inputs, grads=False).terms == ()
