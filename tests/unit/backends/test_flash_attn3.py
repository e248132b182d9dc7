"""FlashAttention-3's translations against stand-ins bound to the real signatures of flash_attn_func and
flash_attn_with_kvcache in Dao-AILab/flash-attention hopper/flash_attn_interface.py (stored at commit 01afd16), with
their documented semantics, and hopper/flash_api.cpp (stored at commit 000090d) for the checks the C++ makes:
q (batch, seqlen, nheads, headdim), or (total_q, nheads, headdim) with cu_seqlens_q and max_seqlen_q; k/v (batch,
seqlen_k, nheads_k, headdim[_v]), or paged caches (num_blocks, page_block_size, nheads_k, headdim) with page_table
(batch, max_num_blocks_per_seq) int32, "page_block_size can be arbitrary", cache_seqlens (batch,) int32; causal
"aligned to the bottom right corner"; window [i + seqlen_k - seqlen_q - window_size[0], i + seqlen_k - seqlen_q +
window_size[1]]; softcap on the scaled scores; q, k, v of one dtype, FP8 e4m3 in means bf16 out, q/k/v_descale
CHECK_SHAPE (batch_size, num_heads_k) ("(b, h_k), not (b, h)"), read as float. FA3 cannot be built here (CUDA, sm90).
"""

import inspect
import sys
import types

import pytest
import torch

from harness import AttentionCase
from harness.backends.base import BackwardUnsupported
from harness.calls.bound import backend_inputs, case_kwargs
from harness.oracle.baseline import naive_attention
from harness.cases import fp8
from harness.cases.case import make_inputs
from harness.cases.masks import CacheCausal, Causal, CausalBottomRight, KeyPadding, SlidingWindow
from harness.cases.paged import paged_inputs

CPU = torch.device("cpu")


def _flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                     v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                     pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
    """flash_attn_func's signature at that commit, parameter for parameter."""


def _flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                             cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                             cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                             q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                             window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                             scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                             return_softmax_lse=False):
    """flash_attn_with_kvcache's signature at that commit, parameter for parameter."""


def _dequantized(x, descale, b, heads_axis_groups=1):
    """x of sequence b (n, heads, d) times its (b, kv head) descale; query heads share their kv head's."""
    if descale is None:
        return x.float()
    return x.float() * descale[b].repeat_interleave(heads_axis_groups).view(1, -1, 1)


def _attend(a, b, rows, keys, values):
    """One sequence as documented: rows (n_q, H, D), keys/values (n_k, Hkv, D), dequantized by their descales."""
    g = rows.shape[1] // keys.shape[1]
    rows = _dequantized(rows, a["q_descale"], b, g)
    keys = _dequantized(keys, a["k_descale"], b).repeat_interleave(g, 1)
    values = _dequantized(values, a["v_descale"], b).repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", rows, keys) * a["softmax_scale"]
    if a["softcap"] > 0:
        s = a["softcap"] * torch.tanh(s / a["softcap"])
    n_q, n_k = rows.shape[0], keys.shape[0]
    i, j = torch.arange(n_q).view(-1, 1), torch.arange(n_k).view(1, -1)
    left, right = a["window_size"]
    right = 0 if a["causal"] else right
    shift = n_k - n_q
    if left >= 0:
        s = s.masked_fill(j < i + shift - left, float("-inf"))
    if right >= 0:
        s = s.masked_fill(j > i + shift + right, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1).nan_to_num(0.0), values)


def _checked(a, q, k, v, batch):
    """flash_api.cpp's checks of dtypes and descales, and the output dtype ("For FP8 input, output must have dtype
    BF16")."""
    assert q.dtype == k.dtype == v.dtype, "query and key/value must have the same dtype"
    fp8_in = q.dtype == torch.float8_e4m3fn
    for name in ("q_descale", "k_descale", "v_descale"):
        t = a[name]
        assert (t is not None) == fp8_in, f"{name} given for {q.dtype}"
        if t is not None:  # flash_api.cpp: CHECK_SHAPE(q_descale, batch_size, num_heads_k); data_ptr<float>()
            assert tuple(t.shape) == (batch, k.shape[-2]) and t.dtype == torch.float32
    return torch.bfloat16 if fp8_in else q.dtype


@pytest.fixture
def fa3(monkeypatch):
    calls = []

    def flash_attn_func(*args, **kwargs):
        bound = inspect.signature(_flash_attn_func).bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        calls.append(a)
        q, k, v = a["q"], a["k"], a["v"]
        out_dtype = _checked(a, q, k, v, q.shape[0])
        out = torch.stack([_attend(a, b, q[b], k[b], v[b]) for b in range(q.shape[0])])
        return out.to(out_dtype)

    def flash_attn_with_kvcache(*args, **kwargs):
        bound = inspect.signature(_flash_attn_with_kvcache).bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        calls.append(a)
        q, table, used = a["q"], a["page_table"], a["cache_seqlens"].tolist()
        assert table.dtype == a["cache_seqlens"].dtype == torch.int32
        cu = a["cu_seqlens_q"].tolist() if a["cu_seqlens_q"] is not None else None
        out_dtype = _checked(a, q, a["k_cache"], a["v_cache"], len(used))
        out = torch.zeros(*q.shape[:-1], a["v_cache"].shape[-1], dtype=out_dtype)
        for b, n_k in enumerate(used):
            rows = q[cu[b]:cu[b + 1]] if cu is not None else q[b]
            keys, values = (t[table[b].long()].flatten(0, 1)[:n_k] for t in (a["k_cache"], a["v_cache"]))
            o = _attend(a, b, rows, keys, values).to(out_dtype)
            if cu is not None:
                out[cu[b]:cu[b + 1]] = o
            else:
                out[b] = o
        return out

    module = types.ModuleType("flash_attn_interface")
    module.flash_attn_func = flash_attn_func
    module.flash_attn_with_kvcache = flash_attn_with_kvcache
    monkeypatch.setitem(sys.modules, "flash_attn_interface", module)
    return calls


def _expected(case, inputs):
    """The spec's answer on the values the backend gets: float32 attention of the (dequantized) inputs."""
    q, k, v = inputs.q, inputs.k, inputs.v
    if case.fp8_kv is not None:
        k, v = fp8.dequantized_kv(case, k, v, torch.float32)
        q = fp8.dequantized_q(case, q, torch.float32) if case.fp8_q else q
    return naive_attention(q.float(), k.float(), v.float(), case.mask, case.scale, softcap=case.softcap)


def _run(case, requires_grad=False):
    from harness.backends.flash_attn3 import FlashAttn3

    backend, inputs = FlashAttn3(), make_inputs(case)
    assert backend.not_supported_reasons(case) == [] and backend.modifier_reasons(case) == []
    q, k, v, _ = backend_inputs(backend, case, inputs, requires_grad=requires_grad)
    kwargs = case_kwargs(case, CPU, {})
    out = backend.forward(q, k, v, mask=case.mask, scale=case.scale, prepared=backend.prepare(case, CPU), **kwargs)
    return backend, inputs, out


@pytest.mark.parametrize("case", [
    AttentionCase(2, 4, 40, 32, "bf16", kv_heads=2),
    AttentionCase(2, 4, 40, 32, "fp16", mask=Causal()),
    AttentionCase(2, 4, 24, 32, "bf16", kv_heads=1, seq_k=57, mask=CausalBottomRight()),
    AttentionCase(1, 4, 57, 32, "bf16", kv_heads=2, seq_k=40, mask=CausalBottomRight()),
    AttentionCase(2, 4, 30, 32, "bf16", seq_k=50, mask=SlidingWindow(7, 3)),
    AttentionCase(2, 4, 33, 32, "bf16", kv_heads=2, mask=Causal(), softcap=20.0),
    AttentionCase(2, 4, 33, 64, "bf16", head_dim_v=128, mask=Causal()),
    AttentionCase(2, 4, 33, 32, "bf16", kv_heads=2, mask=Causal(), fp8_kv="tensor", fp8_q=True),
    AttentionCase(2, 6, 33, 32, "bf16", kv_heads=3, seq_k=47, mask=CausalBottomRight(), fp8_kv="head", fp8_q=True),
], ids=lambda c: c.id)
def test_fa3_contiguous_calls_compute_the_spec(fa3, case):
    backend, inputs, out = _run(case)
    expected = _expected(case, inputs)
    assert out.dtype == case.dtype  # FP8 in, bf16 out: the case's dtype
    torch.testing.assert_close(backend.from_layout(out).float(), expected, atol=2e-2, rtol=2e-2)
    (args,) = fa3
    assert args["softcap"] == (case.softcap or 0.0) and args["softmax_scale"] == case.scale
    assert (args["q"].dtype == fp8.FP8_DTYPE) == case.fp8_q


def test_fa3_fp8_descales_are_the_case_s_scales_per_sequence_and_kv_head(fa3):
    case = AttentionCase(3, 6, 8, 32, "bf16", kv_heads=3, seq_k=20, fp8_kv="head", fp8_q=True)
    _run(case)
    (args,) = fa3
    q_scale, (k_scale, v_scale) = fp8.q_scales(3, "head"), fp8.kv_scales(3, "head")
    for name, scale in (("q_descale", q_scale), ("k_descale", k_scale), ("v_descale", v_scale)):
        assert torch.equal(args[name], scale.view(1, 3).expand(3, 3))
    assert len(set(q_scale.tolist())) == 3  # per-group scales that differ: reading one for all would be wrong


def test_fa3_backward_runs_through_flash_attn_func_and_refuses_head_dim_v(fa3):
    case = AttentionCase(2, 4, 16, 32, "bf16", kv_heads=2, mask=Causal())
    _, _, out = _run(case, requires_grad=True)
    assert out.requires_grad  # the stand-in differentiates as flash_attn_func's FlashAttnFunc does
    with pytest.raises(BackwardUnsupported, match="backward takes no V head dim"):
        _run(AttentionCase(2, 4, 16, 64, "bf16", head_dim_v=128), requires_grad=True)


@pytest.mark.parametrize("case", [
    AttentionCase(4, 4, 12, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33, 27), (12, 1, 4, 1)),
                  page_size=16),
    AttentionCase(3, 4, 4, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16),
    AttentionCase(3, 4, 4, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16,
                  fp8_kv="head", fp8_q=True),
    AttentionCase(4, 4, 12, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33, 27), (12, 1, 4, 1)),
                  page_size=16, fp8_kv="tensor", fp8_q=True),
], ids=lambda c: c.id)
def test_fa3_paged_calls_compute_the_spec(fa3, case):
    from harness.backends.flash_attn3 import FlashAttn3

    backend, inputs = FlashAttn3(), make_inputs(case)
    q, k_cache, v_cache, _ = backend_inputs(backend, case, inputs, requires_grad=False)  # the caches FP8 if so
    _, _, table, lengths = paged_inputs(case, inputs.k, inputs.v)
    kwargs = {n: t for n, t in case_kwargs(case, CPU, {}).items() if n.endswith("scale")}
    out = backend.forward(q, k_cache, v_cache, mask=case.mask, scale=case.scale,
                          prepared=backend.prepare(case, CPU), block_table=table, cache_seqlens=lengths, **kwargs)
    assert out.dtype == case.dtype
    torch.testing.assert_close(backend.from_layout(out).float(), _expected(case, inputs), atol=2e-2, rtol=2e-2)
    (args,) = fa3
    assert args["causal"] is True and (args["cu_seqlens_q"] is not None) == case.mask.mixed


@pytest.mark.parametrize("case, reason", [
    (AttentionCase(3, 4, 4, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16,
                   fp8_kv="tensor"), "FP8 path takes Q, K and V all in FP8"),
    (AttentionCase(2, 4, 8, 32, "bf16", seq_k=12, mask=Causal()), "top-left causal with seq_q=8 != seq_k=12"),
    (AttentionCase(2, 4, 8, 32, "bf16", mask=KeyPadding((8, 5))), "no form for mask"),
    (AttentionCase(2, 4, 8, 32, "bf16", sinks=True), "no learnable sink"),
    (AttentionCase(2, 4, 8, 32, "bf16", alibi=True), "takes no alibi_slopes"),
    (AttentionCase(2, 4, 8, 128, "bf16", head_dim_v=64), "V head dim other than Q/K's"),
    (AttentionCase(2, 4, 8, 40, "bf16", fp8_kv="head", fp8_q=True), "multiples of 16 (FP8)"),
    (AttentionCase(2, 4, 8, 36, "bf16"), "multiples of 8"),
], ids=lambda x: x.id if isinstance(x, AttentionCase) else "")
def test_fa3_refusals_say_why(case, reason):
    from harness.backends.flash_attn3 import FlashAttn3

    reasons = FlashAttn3().can_run(case, CPU)
    assert any(reason in r for r in reasons), reasons


def test_fa3_declares_fp8_q_and_backward():
    from harness.backends.flash_attn3 import FlashAttn3

    case = AttentionCase(2, 4, 8, 32, "bf16", fp8_kv="tensor", fp8_q=True)
    assert FlashAttn3().can_run(case, CPU) == []
    assert FlashAttn3().can_run(AttentionCase(2, 4, 8, 32, "bf16"), CPU, backward=True) == []
