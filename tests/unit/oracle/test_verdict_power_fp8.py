"""FP8 KV caches: the verdict judges the kernel on the dequantized values (a correct FP8 plugin passes with the
same-precision baseline's tolerance), catches the scale bugs (tests/fixtures/broken_fp8.py), and reports the
quantization's own error beside it (quant_err). FP8 cases are forward-only: the reference math is the plain one
on dequantized K/V (its gradients are gradchecked in test_reference.py), so no new gradient to check."""

import pytest
import torch

import harness
from harness import AttentionCase
from harness.spec.fp8 import FP8_DTYPE, dequantize, kv_scales, magnitudes, quantize
from harness.spec.masks import CacheCausal, Causal

#: per-tensor and per-head scales, causal with GQA (bf16) and over no mask (fp16, MHA)
PER_TENSOR = AttentionCase(2, 4, 33, 32, "bf16", kv_heads=2, seq_k=65, mask=Causal(), fp8_kv="tensor")
PER_HEAD = AttentionCase(2, 4, 33, 32, "fp16", kv_heads=4, seq_k=65, fp8_kv="head")
BUGS = {"broken-fp8-scale-twice": [PER_TENSOR, PER_HEAD], "broken-fp8-no-scale": [PER_TENSOR, PER_HEAD],
        "broken-fp8-k-scale-for-v": [PER_TENSOR, PER_HEAD], "broken-fp8-head-scale-as-tensor": [PER_HEAD]}


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
    df = harness.check(["fp8-correct", "naive"], [PER_TENSOR, PER_HEAD], "cpu")
    fwd = df[df.phase == "fwd"]
    assert set(fwd.status) == {"pass"}, fwd[["case_id", "backend", "status", "reason"]]
    # the quantization's error is the case's: the same for every backend, and far above the kernel's own error
    for _, rows in fwd.groupby("case_id"):
        assert rows.quant_err.nunique() == 1 and (rows.quant_err > 10 * rows.out_err).all()
    assert set(df[df.phase == "bwd"].status) == {"unsupported"}
    assert set(fwd.fp8_kv) == {"tensor", "head"}


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
])
def test_bad_fp8_cases_get_one_line_errors(kwargs, match):
    with pytest.raises(ValueError, match=match) as err:
        AttentionCase(2, 4, 8, 32, "bf16", **kwargs)
    assert "\n" not in str(err.value)


def test_fp8_case_ids_say_so():
    assert PER_TENSOR.id == "bf16-b2-h4kv2-s33x65-d32-causal-fp8kv-tensor"
    assert PER_HEAD.id == "fp16-b2-h4-s33x65-d32-none-fp8kv-head"
