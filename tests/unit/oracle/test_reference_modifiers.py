"""The float64 reference with modifiers: its hand-written gradients against gradcheck (each modifier and every
combination a model uses), against an independent autograd implementation, chunking, and the spec's formulas."""

import math

import pytest
import torch

from harness import AttentionCase, Inputs, make_inputs, reference_attention
from harness.oracle.baseline import modifier_rows, naive_rows
from harness.cases import alibi_slopes
from harness.cases.masks import Causal, CausalBottomRight, KeyPadding, SlidingWindow

#: (name, case): each modifier alone, then the combinations models use
CASES = [
    ("softcap", AttentionCase(2, 2, 5, 3, "fp64", kv_heads=1, seq_k=6, softcap=1.5, scale=0.7)),
    ("sinks", AttentionCase(2, 2, 5, 3, "fp64", seq_k=6, sinks=True)),
    ("alibi", AttentionCase(1, 3, 5, 3, "fp64", seq_k=7, alibi=True)),
    ("bias-head", AttentionCase(2, 2, 4, 3, "fp64", seq_k=5, bias="head")),
    ("bias-full", AttentionCase(2, 2, 4, 3, "fp64", seq_k=5, bias="full")),
    ("head_dim_v", AttentionCase(1, 2, 4, 3, "fp64", seq_k=5, head_dim_v=5)),
    ("softcap+causal+window", AttentionCase(1, 2, 6, 3, "fp64", softcap=2.0, mask=Causal() & SlidingWindow(2, 0))),
    ("sinks+window", AttentionCase(1, 4, 6, 3, "fp64", kv_heads=2, seq_k=7, sinks=True, mask=SlidingWindow(2, 0))),
    ("alibi+causal", AttentionCase(1, 2, 4, 3, "fp64", seq_k=6, alibi=True, mask=CausalBottomRight())),
    ("bias+keypad", AttentionCase(2, 2, 4, 3, "fp64", seq_k=5, bias="head", mask=KeyPadding((5, 2)))),
    ("head_dim_v+causal", AttentionCase(1, 2, 5, 4, "fp64", head_dim_v=2, mask=Causal())),
    ("all+empty-rows", AttentionCase(2, 2, 5, 3, "fp64", seq_k=3, softcap=2.0, sinks=True, alibi=True, bias="full",
                                     head_dim_v=2, mask=CausalBottomRight() & KeyPadding((3, 0)))),
]
IDS = [name for name, _ in CASES]
GRAD_INPUTS = ("q", "k", "v", "sinks", "bias")


class _RefFn(torch.autograd.Function):
    """The reference as an autograd function of (q, k, v, sinks, bias) whose backward is the hand-written one."""

    @staticmethod
    def forward(ctx, case, q, k, v, sinks, bias):
        ctx.save_for_backward(q, k, v, sinks, bias)
        ctx.case = case
        d_out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
        return reference_attention(case, Inputs(q, k, v, d_out, sinks, bias), grads=False).out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, sinks, bias = ctx.saved_tensors
        ref = reference_attention(ctx.case, Inputs(q, k, v, d_out, sinks, bias), block=2)
        return None, ref.dq, ref.dk, ref.dv, ref.dsinks, ref.dbias


def _leaves(case, seed=5):
    inputs = make_inputs(case, seed=seed)
    return [None if t is None else t.clone().requires_grad_() for t in (inputs.q, inputs.k, inputs.v, inputs.sinks,
                                                                       inputs.bias)]


@pytest.mark.parametrize("case", [c for _, c in CASES], ids=IDS)
def test_gradcheck(case):
    args = _leaves(case)
    present = [i for i, t in enumerate(args) if t is not None]

    def fn(*tensors):
        full = list(args)
        for i, t in zip(present, tensors):
            full[i] = t
        return _RefFn.apply(case, *full)

    assert torch.autograd.gradcheck(fn, [args[i] for i in present])


@pytest.mark.parametrize("case", [c for _, c in CASES], ids=IDS)
def test_matches_independent_autograd_and_chunks(case):
    """naive_rows in float64 through autograd (the sink as a logit column, the cap by torch.tanh) agrees."""
    inputs = make_inputs(case, seed=3)
    leaves = {n: getattr(inputs, n).clone().requires_grad_() for n in GRAD_INPUTS if getattr(inputs, n) is not None}
    mods = modifier_rows(case, inputs._replace(**leaves), (0, case.seq_q), torch.float64)
    out = naive_rows(leaves["q"], leaves["k"], leaves["v"], case.key_mask(), case.scale, **mods)
    out.backward(inputs.d_out)
    for block in (2, 100):
        ref = reference_attention(case, inputs, block=block)
        torch.testing.assert_close(ref.out, out, rtol=1e-10, atol=1e-12)
        for name, leaf in leaves.items():
            torch.testing.assert_close(ref.get("d" + name), leaf.grad, rtol=1e-10, atol=1e-12)


def test_alibi_slopes_follow_the_paper():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # 12 heads: the 8 slopes of 8 heads, then every other slope of 16 heads (2^-0.5, 2^-1.5, ...)
    expected = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -(0.5 + i) for i in range(4)]
    assert torch.allclose(alibi_slopes(12), torch.tensor(expected))
    assert alibi_slopes(1).tolist() == [2.0 ** -8]
    with pytest.raises(ValueError, match="heads=0"):
        alibi_slopes(0)


def test_fully_masked_row_with_sink_is_zero_and_sink_takes_the_weight():
    case = AttentionCase(1, 2, 3, 4, "fp64", seq_k=3, sinks=True, mask=KeyPadding((0,)))
    ref = reference_attention(case, make_inputs(case))
    assert torch.all(ref.out == 0) and torch.all(ref.dq == 0) and torch.all(ref.dsinks == 0)


def test_sink_by_hand():
    # one key, score 0, sink sigma = log 3: P = 1 / (1 + 3), so out = v / 4
    q, k = torch.zeros(1, 1, 1, 2, dtype=torch.float64), torch.zeros(1, 1, 1, 2, dtype=torch.float64)
    v = torch.tensor([[[[4.0, 8.0]]]], dtype=torch.float64)
    case = AttentionCase(1, 1, 1, 2, "fp64", sinks=True)
    out = reference_attention(case, Inputs(q, k, v, torch.zeros_like(v), torch.tensor([math.log(3.0)]).double()),
                              grads=False).out
    assert torch.allclose(out.flatten(), torch.tensor([1.0, 2.0], dtype=torch.float64))


def test_inputs_make_the_modifiers_matter_and_plain_inputs_are_unchanged():
    plain = AttentionCase(2, 4, 64, 32, "fp32", kv_heads=2)
    capped = AttentionCase(2, 4, 64, 32, "fp32", kv_heads=2, softcap=20.0, sinks=True, bias="full")
    a, b = make_inputs(plain, seed=7), make_inputs(capped, seed=7)
    assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v) and torch.equal(a.d_out, b.d_out)
    assert a.sinks is None and a.bias is None and b.sinks.shape == (4,) and b.bias.shape == (2, 4, 64, 64)
    scores = (b.q @ b.k.repeat_interleave(2, 1).transpose(-1, -2)) * capped.scale
    share = (scores.abs() > 20.0).float().mean()
    assert 0.02 < share < 0.1  # a visible share of logits exceeds the cap
    # the sink takes a visible share of a row's weight: sigma within a few units of the row's log-denominator
    assert (b.sinks - math.log(64)).abs().max() < 4
