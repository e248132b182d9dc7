"""FlashAttention-3's paged translation against a stand-in bound to the real signature of flash_attn_with_kvcache in
Dao-AILab/flash-attention hopper/flash_attn_interface.py (stored at commit 01afd16), with its documented semantics:
q (batch, seqlen, nheads, headdim), or (total_q, nheads, headdim) with cu_seqlens_q and max_seqlen_q; caches
(num_blocks, page_block_size, nheads_k, headdim) with page_table (batch, max_num_blocks_per_seq) int32, "page_block_size
can be arbitrary"; cache_seqlens (batch,) int32; causal "aligned to the bottom right corner". FA3 cannot be built
here (CUDA, sm90)."""

import inspect
import sys
import types

import pytest
import torch

from harness import AttentionCase
from harness.oracle.baseline import naive_attention
from harness.spec.case import make_inputs
from harness.spec.masks import CacheCausal
from harness.spec.paged import paged_inputs


def _flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                             cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                             cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                             q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                             window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                             scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                             return_softmax_lse=False):
    """The signature at that commit, parameter for parameter."""


@pytest.fixture
def fa3(monkeypatch):
    calls = []

    def flash_attn_with_kvcache(*args, **kwargs):
        bound = inspect.signature(_flash_attn_with_kvcache).bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        calls.append(a)
        q, table, used = a["q"], a["page_table"], a["cache_seqlens"].tolist()
        assert table.dtype == a["cache_seqlens"].dtype == torch.int32
        cu = a["cu_seqlens_q"].tolist() if a["cu_seqlens_q"] is not None else None
        out = torch.zeros_like(q)
        for b, n_k in enumerate(used):
            rows = q[cu[b]:cu[b + 1]] if cu is not None else q[b]
            g = q.shape[-2] // a["k_cache"].shape[2]
            keys, values = (t[table[b].long()].flatten(0, 1)[:n_k].float().repeat_interleave(g, 1)
                            for t in (a["k_cache"], a["v_cache"]))
            s = torch.einsum("qhd,khd->hqk", rows.float(), keys) * a["softmax_scale"]
            n_q = rows.shape[0]
            if a["causal"]:
                s = s.masked_fill(torch.arange(n_k).view(1, -1) > torch.arange(n_q).view(-1, 1) + n_k - n_q,
                                  float("-inf"))
            o = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), values).to(q.dtype)
            if cu is not None:
                out[cu[b]:cu[b + 1]] = o
            else:
                out[b] = o
        return out

    module = types.ModuleType("flash_attn_interface")
    module.flash_attn_with_kvcache = flash_attn_with_kvcache
    monkeypatch.setitem(sys.modules, "flash_attn_interface", module)
    return calls


@pytest.mark.parametrize("case", [
    AttentionCase(4, 4, 12, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33, 27), (12, 1, 4, 1)),
                  page_size=16),
    AttentionCase(3, 4, 4, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16),
], ids=lambda c: c.id)
def test_fa3_paged_calls_compute_the_spec(fa3, case):
    from harness.backends.flash_attn3 import FlashAttn3

    backend, inputs = FlashAttn3(), make_inputs(case)
    k_cache, v_cache, table, lengths = paged_inputs(case, inputs.k, inputs.v)
    out = backend.forward(backend.to_layout(inputs.q).contiguous(), k_cache, v_cache, mask=case.mask,
                          scale=case.scale, prepared=backend.prepare(case, torch.device("cpu")), block_table=table,
                          cache_seqlens=lengths)
    expected = naive_attention(*(t.float() for t in inputs[:3]), case.mask, case.scale)
    torch.testing.assert_close(backend.from_layout(out).float(), expected, atol=2e-2, rtol=2e-2)
    (args,) = fa3
    assert args["causal"] is True and (args["cu_seqlens_q"] is not None) == case.mask.mixed


def test_fa3_refusals_say_why():
    from harness.backends.flash_attn3 import CONTIGUOUS_REFUSAL, FP8_REFUSAL, FlashAttn3

    fp8 = AttentionCase(3, 4, 4, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16,
                        fp8_kv="tensor")
    assert FP8_REFUSAL in FlashAttn3().not_supported_reasons(fp8)
    assert CONTIGUOUS_REFUSAL in FlashAttn3().not_supported_reasons(AttentionCase(2, 4, 8, 32, "bf16"))
    assert FlashAttn3().can_run(AttentionCase(2, 4, 8, 32, "bf16"), torch.device("cuda"), backward=True)
