"""FP8 KV caches and FP8 Q/K/V: the verdict judges the kernel on the dequantized values (a correct FP8 plugin passes
with the same-precision baseline's tolerance), catches the scale bugs of K/V and of q (tests/fixtures/broken_fp8.py),
and reports the quantization's own error beside it (quant_err). FP8 cases are forward-only: the reference math is the
plain one on dequantized q/K/V (its gradients are gradchecked in test_reference.py), so no new gradient to check."""

import pytest
import torch

import harness
from harness import AttentionCase
from harness.cases.fp8 import (FP8_DTYPE, dequantize, kv_scales, magnitudes, per_query_head, q_scales,
                              query_magnitudes, quantize)
from harness.cases.masks import CacheCausal, Causal

#: per-tensor and per-head scales, causal with GQA (bf16) and over no mask (fp16, MHA)
PER_TENSOR = AttentionCase(2, 4, 33, 32, "bf16", kv_heads=2, seq_k=65, mask=Causal(), fp8_kv="tensor")
PER_HEAD = AttentionCase(2, 4, 33, 32, "fp16", kv_heads=4, seq_k=65, fp8_kv="head")
#: FP8 Q/K/V (bf16 out): per tensor causal with GQA, per kv-head group (three groups of two query heads)
Q_PER_TENSOR = AttentionCase(2, 4, 33, 32, "bf16", kv_heads=2, seq_k=65, mask=Causal(), fp8_kv="tensor", fp8_q=True)
Q_PER_GROUP = AttentionCase(2, 6, 33, 32, "bf16", kv_heads=3, seq_k=65, fp8_kv="head", fp8_q=True)
BUGS = {"broken-fp8-scale-twice": [PER_TENSOR, PER_HEAD, Q_PER_GROUP],
        "broken-fp8-no-scale": [PER_TENSOR, PER_HEAD, Q_PER_TENSOR],
        "broken-fp8-k-scale-for-v": [PER_TENSOR, PER_HEAD, Q_PER_GROUP],
        "broken-fp8-head-scale-as-tensor": [PER_HEAD, Q_PER_GROUP],
        "broken-fp8-q-scale-twice": [Q_PER_TENSOR, Q_PER_GROUP], "broken-fp8-q-no-scale": [Q_PER_TENSOR, Q_PER_GROUP],
        "broken-fp8-q-head-scale-as-tensor": [Q_PER_GROUP]}


@pytest.fixture(scope="module")
def fp8_plugins():
    from tests.fixtures import broken_fp8
    return broken_fp8


@pytest.mark.parametrize("name", sorted(BUGS))
def test_planted_fp8_scale_bug_fails(fp8_plugins, name):
    df = harness.check([name], BUGS[name], "cpu")
    fwd = df[df.phase == "fwd"]
    assert list(fwd.status) == ["fail"] * len(BUGS[name]), fwd[["case_id", "status", "reason"]]
    assert (fwd.out_err > fwd.out_tol).all()


def test_correct_fp8_plugin_passes_and_quant_err_is_reported_beside(fp8_plugins):
    df = harness.check(["fp8-correct", "naive"], [PER_TENSOR, PER_HEAD, Q_PER_TENSOR, Q_PER_GROUP], "cpu")
    fwd = df[df.phase == "fwd"]
    assert set(fwd.status) == {"pass"}, fwd[["case_id", "backend", "status", "reason"]]
    # the quantization's error is the case's: the same for every backend, and far above the kernel's own error
    for _, rows in fwd.groupby("case_id"):
        assert rows.quant_err.nunique() == 1 and (rows.quant_err > 3 * rows.out_err).all()
    assert set(df[df.phase == "bwd"].status) == {"unsupported"}
    assert set(fwd.fp8_kv) == {"tensor", "head"}
    assert fwd.fp8_q.sum() == 4 and fwd.fp8_q.isna().sum() == 4  # the Q/K/V cases' rows say so, the others empty


def test_quant_err_covers_q_s_quantization():
    """quant_err of an FP8 Q/K/V case is the output's error against the unquantized reference with q, K and V all
    quantized (max|ref(dequantized q, K, V) - ref(q, K, V)|), not K/V's alone on the same inputs."""
    from harness.run.runner import prepare_case
    from harness.oracle.reference import reference_attention
    from harness.cases.fp8 import dequantized_kv, dequantized_q

    prepared = prepare_case(Q_PER_TENSOR, torch.device("cpu"))
    inputs = prepared.inputs
    plain = reference_attention(Q_PER_TENSOR, inputs, grads=False).out
    kv_only = inputs._replace(**dict(zip("kv", dequantized_kv(Q_PER_TENSOR, inputs.k, inputs.v, torch.float64))))
    kv_err = float((reference_attention(Q_PER_TENSOR, kv_only, grads=False).out - plain).abs().max())
    qkv = kv_only._replace(q=dequantized_q(Q_PER_TENSOR, inputs.q, torch.float64))
    qkv_err = float((reference_attention(Q_PER_TENSOR, qkv, grads=False).out - plain).abs().max())
    assert prepared.quant_err == pytest.approx(qkv_err, rel=1e-12) and abs(qkv_err - kv_err) > 1e-2 * kv_err


@pytest.mark.parametrize("name", ["flashinfer", "xformers", "flash-attn", "flash-attn-4"])
def test_backends_without_fp8_queries_refuse_them_with_the_reason(name):
    from harness.backends.registry import get_backends

    (backend,) = get_backends([name])
    reasons = backend.can_run(Q_PER_GROUP, torch.device("cpu"))
    assert any("FP8" in r for r in reasons), reasons
    if name != "flash-attn-4":
        assert f"{name} takes no FP8 queries (fp8_q=False)" in reasons
    else:  # its own reason: its public functions take no descale
        from harness.backends.flash_attn4 import FP8_REFUSAL
        assert FP8_REFUSAL in reasons


def test_a_backend_without_fp8_kv_is_refused_with_the_reason():
    df = harness.check(["sdpa-math"], [PER_TENSOR], "cpu")  # sdpa-math is an SDPA kernel: it dequantizes
    assert set(df[df.phase == "fwd"].status) == {"pass"}
    from tests.fixtures import broken_paged  # noqa: F401 - paged-correct declares no fp8_kv
    case = AttentionCase(3, 4, 4, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16,
                         fp8_kv="head")
    df = harness.check(["paged-correct"], [case], "cpu")
    assert "takes no FP8 KV cache (fp8_kv=False)" in df.reason.iloc[0]


def test_scales_differ_per_head_and_between_k_and_v_and_round_trip():
    k_scale, v_scale = kv_scales(4, "head")
    assert k_scale.shape == (4,) and len(set(k_scale.tolist())) == 3 and not torch.equal(k_scale, v_scale)
    k_tensor, _ = kv_scales(4, "tensor")
    assert k_tensor.shape == (1,) and k_tensor.item() == k_scale.max().item()
    x = torch.randn(2, 4, 50, 8) * magnitudes(4)[0].view(1, -1, 1, 1)
    x8 = quantize(x, k_scale)
    assert x8.dtype == FP8_DTYPE
    back = dequantize(x8, k_scale, torch.float64)
    # e4m3: 3 mantissa bits, half an ulp relative error 2^-4 (saturated values beyond 448 * scale aside)
    inside = x.abs() < 448 * k_scale.view(1, -1, 1, 1)
    assert ((back - x.double()).abs() <= x.double().abs() * 2 ** -4 + 2 ** -9 * k_scale.max())[inside].all()


@pytest.mark.parametrize("kwargs, match", [
    (dict(fp8_kv="row"), r"fp8_kv='row': allowed None \(no FP8 cache\) or one of tensor, head"),
    (dict(fp8_kv="head", softcap=30.0), r"fp8_kv='head': an FP8 KV case takes no modifiers"),
    (dict(fp8_q=True), r"fp8_q=True: FP8 queries need an FP8 KV cache .* got fp8_kv=None, dtype bf16"),
    (dict(fp8_q=True, fp8_kv="head", dtype="fp16"), r"fp8_q=True: .* dtype bf16 .* got fp8_kv='head', dtype fp16"),
    (dict(fp8_q=1, fp8_kv="head"), r"fp8_q=1: must be True or False"),
])
def test_bad_fp8_cases_get_one_line_errors(kwargs, match):
    kwargs = {"dtype": "bf16", **kwargs}
    with pytest.raises(ValueError, match=match) as err:
        AttentionCase(2, 4, 8, 32, **kwargs)
    assert "\n" not in str(err.value)


def test_fp8_case_ids_say_so():
    assert PER_TENSOR.id == "bf16-b2-h4kv2-s33x65-d32-causal-fp8kv-tensor"
    assert PER_HEAD.id == "fp16-b2-h4-s33x65-d32-none-fp8kv-head"
    assert Q_PER_GROUP.id == "bf16-b2-h6kv3-s33x65-d32-none-fp8qkv-head"


def test_q_scales_follow_the_granularity_per_kv_head_group_and_round_trip():
    group = q_scales(3, "head")
    assert group.shape == (3,) and len(set(group.tolist())) == 3 and q_scales(3, "tensor").item() == group.max().item()
    per_head = per_query_head(group, 6)  # query heads 2g, 2g+1 share group g's scale
    assert torch.equal(per_head, group.repeat_interleave(2)) and torch.equal(per_query_head(group[:1] * 0 + 1, 6),
                                                                             torch.ones(1))
    q = torch.randn(2, 6, 40, 16) * per_query_head(query_magnitudes(3), 6).view(1, -1, 1, 1)
    back = dequantize(quantize(q, per_head), per_head, torch.float64)
    inside = q.abs() < 448 * per_head.view(1, -1, 1, 1)
    assert ((back - q.double()).abs() <= q.double().abs() * 2 ** -4 + 2 ** -9 * group.max())[inside].all()
