"""FlashAttention-4's translation against stand-ins bound to the real signatures of flash-attn-4 4.0.0b36's
flash_attn/cute/interface.py (flash_attn_func, flash_attn_varlen_func; read from the wheel, which is pure Python but
imports nvidia-cutlass-dsl, not installed here) with its documented semantics: q/k/v (batch, seqlen, heads, hdim) or
varlen (total_q, heads, hdim) by cu_seqlens_q; page_table (batch, max_pages) int32 with seqused_k and K/V (num_pages,
page_size, kv_heads, hdim); causal bottom-right per sequence (mask.py: col_limit_right = row + 1 + seqlen_k -
seqlen_q); softcap on the scaled scores. Capabilities per architecture and every refusal's reason."""

import inspect
import sys
import types

import pytest
import torch

from harness import AttentionCase
from harness.oracle.baseline import naive_attention
from harness.spec.case import make_inputs
from harness.spec.masks import CacheCausal, Causal, KeyPadding
from harness.spec.paged import paged_inputs


def _flash_attn_func(q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None, causal=False,
                     window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
                     deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None, aux_tensors=None,
                     aux_scalars=None, block_sparse_tensors=None, block_sparse_tensors_bwd=None, return_lse=False,
                     gather_bwd_recompute_p=False, gather_bwd_token_chunk=None):
    """flash_attn_func's signature in 4.0.0b36, parameter for parameter."""


def _flash_attn_varlen_func(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                            max_seqlen_k=None, min_seqlen_k=None, seqused_q=None, seqused_k=None,
                            gather_kv_indices=None, page_table=None, softmax_scale=None, causal=False,
                            window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
                            deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None,
                            block_sparse_tensors=None, aux_tensors=None, aux_scalars=None, return_lse=False,
                            scheduler_metadata=None, seqlen_k_per_split=None, disable_scheduler_metadata=False,
                            gather_bwd_recompute_p=False, gather_bwd_token_chunk=None):
    """flash_attn_varlen_func's signature in 4.0.0b36, parameter for parameter."""


def _attend(q, keys, values, scale, causal, softcap):
    """One sequence: q (n_q, H, D), keys/values (n_k, Hkv, D); bottom-right causal; softcap on scaled scores."""
    g = q.shape[1] // keys.shape[1]
    keys, values = keys.float().repeat_interleave(g, 1), values.float().repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q.float(), keys) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    n_q, n_k = q.shape[0], keys.shape[0]
    if causal:
        s = s.masked_fill(torch.arange(n_k).view(1, -1) > torch.arange(n_q).view(-1, 1) + n_k - n_q, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), values).to(q.dtype)


@pytest.fixture
def fa4(monkeypatch):
    calls = []

    def flash_attn_func(*args, **kwargs):
        a = inspect.signature(_flash_attn_func).bind(*args, **kwargs)
        a.apply_defaults()
        calls.append(("func", dict(a.arguments)))
        a = a.arguments
        return torch.stack([_attend(a["q"][b], a["k"][b], a["v"][b], a["softmax_scale"], a["causal"], a["softcap"])
                            for b in range(a["q"].shape[0])])

    def flash_attn_varlen_func(*args, **kwargs):
        a = inspect.signature(_flash_attn_varlen_func).bind(*args, **kwargs)
        a.apply_defaults()
        calls.append(("varlen", dict(a.arguments)))
        a = a.arguments
        q, table, used = a["q"], a["page_table"], a["seqused_k"].tolist()
        assert table.dtype == torch.int32 and a["cu_seqlens_k"] is None   # "page_table is not supported with cu_seqlens_k"
        cu = a["cu_seqlens_q"]
        runs = ([q[cu[b]:cu[b + 1]] for b in range(len(used))] if cu is not None else [q[b] for b in range(len(used))])
        outs = []
        for b, rows in enumerate(runs):
            keys, values = (t[table[b].long()].flatten(0, 1)[:used[b]] for t in (a["k"], a["v"]))
            outs.append(_attend(rows, keys, values, a["softmax_scale"], a["causal"], a["softcap"]))
        return torch.cat(outs) if a["cu_seqlens_q"] is not None else torch.stack(outs)

    interface = types.ModuleType("flash_attn.cute.interface")
    interface.flash_attn_func, interface.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    cute, package = types.ModuleType("flash_attn.cute"), types.ModuleType("flash_attn")
    cute.interface, package.cute = interface, cute
    for name, module in (("flash_attn", package), ("flash_attn.cute", cute), ("flash_attn.cute.interface", interface)):
        monkeypatch.setitem(sys.modules, name, module)
    return calls


@pytest.mark.parametrize("case", [
    AttentionCase(4, 4, 12, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33, 27), (12, 1, 4, 1)),
                  page_size=16),
    AttentionCase(3, 4, 4, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16),
    AttentionCase(2, 4, 33, 32, "bf16", kv_heads=2, mask=Causal(), softcap=5.0),
], ids=lambda c: c.id)
def test_fa4_calls_compute_the_spec(fa4, case):
    from harness.backends.flash_attn4 import FlashAttn4

    backend, inputs = FlashAttn4(), make_inputs(case)
    plan = backend.prepare(case, torch.device("cpu"))
    q = backend.to_layout(inputs.q).contiguous()
    if case.page_size is not None:
        k_cache, v_cache, table, lengths = paged_inputs(case, inputs.k, inputs.v)
        out = backend.forward(q, k_cache, v_cache, mask=case.mask, scale=case.scale, prepared=plan, block_table=table,
                              cache_seqlens=lengths)
    else:
        k, v = (backend.to_layout(t).contiguous() for t in (inputs.k, inputs.v))
        out = backend.forward(q, k, v, mask=case.mask, scale=case.scale, prepared=plan, softcap=case.softcap)
    expected = naive_attention(*(t.float() for t in inputs[:3]), case.mask, case.scale, softcap=case.softcap)
    torch.testing.assert_close(backend.from_layout(out).float(), expected, atol=2e-2, rtol=2e-2)
    (kind, args), = fa4
    assert kind == ("varlen" if case.page_size else "func") and args["causal"] is True
    if case.page_size is not None and case.mask.mixed:
        assert args["cu_seqlens_q"].tolist() == [0, 12, 13, 17, 18] and args["max_seqlen_q"] == 12


def test_fa4_capabilities_per_architecture_and_refusals_say_why():
    from harness.backends.flash_attn4 import FP8_REFUSAL, FlashAttn4

    backend = FlashAttn4()
    mla = AttentionCase(1, 4, 16, 192, "bf16", head_dim_v=128, mask=Causal())
    wide = AttentionCase(1, 4, 16, 256, "bf16", head_dim_v=128, mask=Causal())
    assert backend.arch_reasons(mla, 9) == [] and backend.arch_reasons(mla, 10) == []
    assert backend.arch_reasons(wide, 9) == []
    assert "flash-attn-4 on sm100 takes head dims 8..128, or (192, 128)" in backend.arch_reasons(wide, 10)[0]
    fp8 = AttentionCase(2, 4, 8, 32, "bf16", fp8_kv="tensor")
    assert FP8_REFUSAL in backend.not_supported_reasons(fp8)
    padded = AttentionCase(2, 4, 8, 32, "bf16", mask=KeyPadding((5, 8)))
    assert any("no form for mask keypad5_8" in r for r in backend.not_supported_reasons(padded))
    alibi = AttentionCase(2, 4, 8, 32, "bf16", alibi=True)
    assert any("FlashAttention-4 has no alibi_slopes" in r for r in backend.modifier_reasons(alibi))


def test_fa4_is_told_apart_from_fa2s_flash_attn(monkeypatch):
    """FA2's interface module present and no flash_attn.cute: FlashAttention-4 is unavailable and says which module."""
    from harness.backends.flash_attn4 import FlashAttn4

    package, fa2 = types.ModuleType("flash_attn"), types.ModuleType("flash_attn.flash_attn_interface")
    package.flash_attn_interface = fa2
    package.__path__ = []
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", fa2)
    monkeypatch.delitem(sys.modules, "flash_attn.cute", raising=False)
    monkeypatch.delitem(sys.modules, "flash_attn.cute.interface", raising=False)
    reason = FlashAttn4().unavailable_reason(torch.device("cuda"))
    assert reason.startswith("flash_attn.cute.interface not importable") and "pip install flash-attn-4" in reason
