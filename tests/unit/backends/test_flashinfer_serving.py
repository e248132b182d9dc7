"""FlashInfer on a mixed serving step and on an FP8 cache, against recorders bound to flashinfer-python 0.6.1's real
signatures (flashinfer/prefill.py BatchPrefillWithPagedKVCacheWrapper.plan(qo_indptr, paged_kv_indptr,
paged_kv_indices, paged_kv_last_page_len, ..., kv_data_type=) and run(q, paged_kv_cache, *, k_scale=, v_scale=);
decode.py BatchDecodeWithPagedKVCacheWrapper.run). What run() does with the scales is read from prefill.py 0.6.1:
`sm_scale *= k_scale` before the kernel and `out *= v_scale` after it - one float each, so per-head scales are
refused."""

import inspect

import pytest
import torch

from harness import AttentionCase
from harness.oracle.baseline import naive_attention
from harness.cases.case import make_inputs
from harness.cases.fp8 import dequantized_kv, kv_scales, quantize
from harness.cases.masks import CacheCausal
from harness.cases.paged import paged_inputs
from tests.unit.backends.test_paged_translations import _documented_run

MIXED = AttentionCase(4, 4, 12, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33, 27), (12, 1, 4, 1)),
                      page_size=16)
FP8_VERIFY = AttentionCase(3, 4, 4, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16,
                           fp8_kv="tensor")
FP8_DECODE = AttentionCase(3, 4, 1, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16,
                           fp8_kv="tensor")


@pytest.fixture
def recorded(monkeypatch):
    """The two paged wrappers replaced by recorders that bind plan() and run() to the real signatures and compute what
    run() documents, scales included (fp8 values read as they are, sm_scale * k_scale, out * v_scale)."""
    flashinfer = pytest.importorskip("flashinfer")
    calls = []

    def fake(real):
        class Recorder:
            def __init__(self, workspace, kv_layout="NHD", **kwargs):
                inspect.signature(real.__init__).bind(self, workspace, kv_layout=kv_layout, **kwargs)

            def plan(self, *args, **kwargs):
                bound = inspect.signature(real.plan).bind(self, *args, **kwargs)
                bound.apply_defaults()
                self.args = dict(bound.arguments)

            def run(self, q, kv, **kwargs):
                bound = inspect.signature(real.run).bind(self, q, kv, **kwargs)
                calls.append((real.__name__, self.args, dict(bound.arguments)))
                k_scale, v_scale = kwargs.get("k_scale"), kwargs.get("v_scale")
                assert k_scale is None or isinstance(k_scale, float)   # a float: no device read in the timed call
                args = dict(self.args, sm_scale=self.args["sm_scale"] * (k_scale or 1.0))
                out = _documented_run(real.__name__, args, q, *(t.float() for t in kv)).float()
                return (out * (v_scale or 1.0)).to(q.dtype)

        return Recorder

    for name in ("BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper"):
        monkeypatch.setattr(flashinfer, name, fake(getattr(flashinfer, name)))
    return calls


def _run(case):
    from harness.backends.flashinfer import FlashInfer

    backend, cpu = FlashInfer(), torch.device("cpu")
    inputs = make_inputs(case)
    k, v = inputs.k, inputs.v
    kwargs = {}
    if case.fp8_kv is not None:
        k_scale, v_scale = kv_scales(case.kv_heads, case.fp8_kv)
        k, v = quantize(k, k_scale), quantize(v, v_scale)
        kwargs = dict(k_scale=k_scale, v_scale=v_scale)
    k_cache, v_cache, table, lengths = paged_inputs(case, k, v)
    plan = backend.prepare(case, cpu)
    out = backend.forward(backend.to_layout(inputs.q).contiguous(), k_cache, v_cache, mask=case.mask,
                          scale=case.scale, prepared=plan, block_table=table, cache_seqlens=lengths, **kwargs)
    return backend.from_layout(out), inputs, plan


def test_a_mixed_step_is_one_paged_prefill_with_per_sequence_qo_indptr(recorded):
    out, inputs, plan = _run(MIXED)
    (wrapper, args, run), = recorded
    assert wrapper == "BatchPrefillWithPagedKVCacheWrapper" and args["causal"] is True
    assert args["qo_indptr"].tolist() == [0, 12, 13, 17, 18] and run["q"].shape == (18, 4, 32)
    expected = naive_attention(*(t.float() for t in inputs[:3]), MIXED.mask, MIXED.scale)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
    assert out[1, :, 1:].abs().sum() == 0 and out[3, :, 1:].abs().sum() == 0        # padding rows stay 0
    assert "q packed by qo_indptr" in plan.op


@pytest.mark.parametrize("case", [FP8_VERIFY, FP8_DECODE], ids=lambda c: c.id)
def test_an_fp8_cache_is_kv_data_type_fp8_with_float_scales(recorded, case):
    out, inputs, _ = _run(case)
    (wrapper, args, run), = recorded
    assert args["kv_data_type"] == torch.float8_e4m3fn and args["q_data_type"] == torch.bfloat16
    k_scale, v_scale = kv_scales(case.kv_heads, "tensor")
    assert (run["k_scale"], run["v_scale"]) == (float(k_scale), float(v_scale))
    k, v = dequantized_kv(case, inputs.k, inputs.v, torch.float32)
    expected = naive_attention(inputs.q.float(), k, v, case.mask, case.scale)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


def test_per_head_scales_and_contiguous_fp8_are_refused_with_the_reason():
    from harness.backends.flashinfer import FlashInfer

    per_head = AttentionCase(3, 4, 4, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)),
                             page_size=16, fp8_kv="head")
    assert any("one k_scale and one v_scale per tensor" in r for r in FlashInfer().not_supported_reasons(per_head))
    contiguous = AttentionCase(2, 4, 8, 32, "bf16", fp8_kv="tensor")
    assert any("contiguous FP8 case is not translated" in r for r in FlashInfer().not_supported_reasons(contiguous))
