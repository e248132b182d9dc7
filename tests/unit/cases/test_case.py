"""The case spec: validation with clear errors, stable ids, deterministic inputs."""

import pytest
import torch

from harness import AttentionCase, make_inputs
from harness.cases.case import parse_dtype
from harness.cases.masks import Causal, KeyPadding


def test_defaults_and_id():
    case = AttentionCase(2, 8, 1024, 128, torch.bfloat16, mask=Causal())
    assert (case.kv_heads, case.seq_k) == (8, 1024)
    assert case.scale == pytest.approx(128 ** -0.5)
    assert case.id == "bf16-b2-h8-s1024-d128-causal"


def test_id_shows_gqa_cross_and_scale():
    case = AttentionCase(1, 8, 113, 64, "fp32", kv_heads=2, seq_k=203, scale=0.5)
    assert case.id == "fp32-b1-h8kv2-s113x203-d64-none-scale0.5"


def test_frozen_and_hashable():
    case = AttentionCase(1, 2, 3, 4, "fp16")
    with pytest.raises(Exception):
        case.batch = 2
    assert {case: 1}[AttentionCase(1, 2, 3, 4, torch.float16)] == 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch=0), "batch=0"),
    (dict(heads=-1), "heads=-1"),
    (dict(seq_q=2.5), "seq_q=2.5"),
    (dict(dtype="int8"), "unknown dtype 'int8'"),
    (dict(kv_heads=3), "heads=8 is not a multiple of kv_heads=3"),
    (dict(scale=0.0), "scale=0.0"),
    (dict(mask="causal"), "mask='causal'"),
    (dict(mask=KeyPadding((4,))), "batch is 2"),
])
def test_bad_input_names_the_value(kwargs, match):
    args = dict(batch=2, heads=8, seq_q=16, head_dim=32, dtype="fp32") | kwargs
    with pytest.raises(ValueError, match=match):
        AttentionCase(args.pop("batch"), args.pop("heads"), args.pop("seq_q"), args.pop("head_dim"),
                      args.pop("dtype"), **args)


def test_parse_dtype_aliases():
    assert parse_dtype("bfloat16") is torch.bfloat16 and parse_dtype("half") is torch.float16


def test_inputs_deterministic_and_shared_across_dtypes():
    a = make_inputs(AttentionCase(1, 4, 5, 8, "fp32", kv_heads=2, seq_k=7), seed=3)
    b = make_inputs(AttentionCase(1, 4, 5, 8, "fp32", kv_heads=2, seq_k=7), seed=3)
    c = make_inputs(AttentionCase(1, 4, 5, 8, "bf16", kv_heads=2, seq_k=7), seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a[:4], b[:4])) and a.sinks is a.bias is None
    assert a.q.shape == (1, 4, 5, 8) and a.k.shape == (1, 2, 7, 8) and a.d_out.shape == a.q.shape
    assert torch.equal(c.q, a.q.bfloat16())
    assert not torch.equal(make_inputs(AttentionCase(1, 4, 5, 8, "fp32", kv_heads=2, seq_k=7), seed=4).q, a.q)
