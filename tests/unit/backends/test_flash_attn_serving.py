"""FlashAttention-2 on a mixed serving step: flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k,
max_seqlen_q, max_seqlen_k, ..., causal=True, block_table=) against a stand-in with the real function's signature
and documented semantics, read from Dao-AILab/flash-attention flash_attn/flash_attn_interface.py (the 2.8.x line,
stored at commit 0053002; flash_attn/__init__.py says __version__ = "2.8.3"): q (total_q, nheads, headdim); "If
causal=True, the causal mask is aligned to the bottom right corner of the attention matrix" of each sequence; "If the
row of the mask is all zero, the output will be zero"; with a block_table, K/V are the paged caches (num_blocks,
page_block_size, nheads_k, headdim) and page_block_size a multiple of 256 (flash_attn_with_kvcache's docstring, the
same kernel). flash-attn cannot be built here (no CUDA)."""

import inspect
import sys
import types

import torch

from harness import AttentionCase
from harness.oracle.baseline import naive_attention
from harness.cases.case import make_inputs
from harness.cases.masks import CacheCausal
from harness.cases.paged import paged_inputs

#: the signature of flash_attn_varlen_func in that file, parameter for parameter
def _real_signature(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    deterministic=False, return_attn_probs=False, block_table=None):
    pass


def _fake_varlen(calls):
    def flash_attn_varlen_func(*args, **kwargs):
        bound = inspect.signature(_real_signature).bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        calls.append(a)
        q, k_cache, v_cache, table = a["q"], a["k"], a["v"], a["block_table"]
        assert a["cu_seqlens_q"].dtype == a["cu_seqlens_k"].dtype == torch.int32 and table.dtype == torch.int32
        assert k_cache.shape[1] % 256 == 0 and q.dim() == 3
        cu_q, cu_k = a["cu_seqlens_q"].tolist(), a["cu_seqlens_k"].tolist()
        heads, kv_heads = q.shape[1], k_cache.shape[2]
        out = torch.zeros_like(q)
        for b in range(len(cu_q) - 1):
            n_q, n_k = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
            keys = k_cache[table[b].long()].flatten(0, 1)[:n_k].float().repeat_interleave(heads // kv_heads, 1)
            values = v_cache[table[b].long()].flatten(0, 1)[:n_k].float().repeat_interleave(heads // kv_heads, 1)
            s = torch.einsum("qhd,khd->hqk", q[cu_q[b]:cu_q[b + 1]].float(), keys) * a["softmax_scale"]
            i, j = torch.arange(n_q).view(-1, 1), torch.arange(n_k).view(1, -1)
            if a["causal"]:  # bottom-right: query i sees keys j <= i + n_k - n_q
                s = s.masked_fill(j > i + n_k - n_q, float("-inf"))
            out[cu_q[b]:cu_q[b + 1]] = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), values).to(q.dtype)
        return out

    return flash_attn_varlen_func


def test_fa2_mixed_step_is_varlen_over_the_pages_with_the_steps_own_cu_seqlens(monkeypatch):
    from harness.backends.flash_attn import FlashAttn2

    calls = []
    fake = types.ModuleType("flash_attn.flash_attn_interface")
    fake.flash_attn_varlen_func = _fake_varlen(calls)
    fake.flash_attn_func = fake.flash_attn_with_kvcache = None
    package = types.ModuleType("flash_attn")
    package.flash_attn_interface = fake
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", fake)
    case = AttentionCase(3, 4, 9, 32, "fp32", kv_heads=2, seq_k=301, mask=CacheCausal((301, 161, 45), (9, 1, 4)),
                         page_size=256)
    inputs = make_inputs(case)
    k_cache, v_cache, table, lengths = paged_inputs(case, inputs.k, inputs.v)
    backend = FlashAttn2()
    plan = backend.prepare(case, torch.device("cpu"))
    out = backend.forward(backend.to_layout(inputs.q), k_cache, v_cache, mask=case.mask, scale=case.scale,
                          prepared=plan, block_table=table, cache_seqlens=lengths)
    expected = naive_attention(inputs.q, inputs.k, inputs.v, case.mask, case.scale)
    torch.testing.assert_close(backend.from_layout(out), expected, atol=1e-5, rtol=1e-5)
    (a,) = calls
    assert a["cu_seqlens_q"].tolist() == [0, 9, 10, 14] and a["cu_seqlens_k"].tolist() == [0, 301, 462, 507]
    assert (a["max_seqlen_q"], a["max_seqlen_k"], a["causal"]) == (9, 301, True) and a["q"].shape == (14, 4, 32)
    assert "varlen paged" in plan.op
    # called directly (no prepared plan): the same call
    out = backend.forward(backend.to_layout(inputs.q), k_cache, v_cache, mask=case.mask, scale=case.scale,
                          block_table=table, cache_seqlens=lengths)
    torch.testing.assert_close(backend.from_layout(out), expected, atol=1e-5, rtol=1e-5)
