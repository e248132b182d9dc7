"""Each backend's paged-KV translation checked against the spec (CacheCausal over a shuffled block table) on CPU."""

import warnings

import pytest
import torch

import harness
from harness import AttentionCase
from harness.spec.case import make_inputs
from harness.spec.masks import CacheCausal
from harness.spec.paged import paged_inputs, paged_layout
from harness.oracle.baseline import naive_attention

#: a decode step and a 4-token verification over caches of 45, 20 and 33 keys in pages of 16 (none a multiple)
DECODE = AttentionCase(3, 4, 1, 32, "fp32", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16)
VERIFY = AttentionCase(3, 4, 4, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16)


def test_gathering_backends_pass_paged_decode_and_verification_forward_only():
    df = harness.check(["naive", "sdpa", "sdpa-math"], [DECODE, VERIFY], "cpu")
    fwd, bwd = df[df.phase == "fwd"], df[df.phase == "bwd"]
    assert set(fwd.status) == {"pass"}, fwd[["case_id", "backend", "status", "reason"]]
    assert fwd.backend_op.str.contains("gather through the block table inside the timed call").all()
    assert set(bwd.status) == {"unsupported"} and bwd.reason.str.contains("forward-only").all()
    assert set(df.page_size) == {16}


def test_flex_paged_mask_mod_over_the_physical_cache_matches_the_spec():
    """The mask_mod flex gets for a paged case (attention-gym examples/paged_attention: physical -> logical page),
    run through torch 2.13's eager flex_attention on CPU (the compiled one is the suites' business)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from harness.backends.flex import paged_mask_mod, physical_kv

    case = VERIFY.__class__(3, 4, 4, 32, "fp32", kv_heads=2, seq_k=45, mask=VERIFY.mask, page_size=16)
    inputs = make_inputs(case)
    k_cache, v_cache, table, _ = paged_inputs(case, inputs.k, inputs.v)
    layout = paged_layout(case)
    mod = paged_mask_mod(case.mask, table, layout.num_blocks, 16, case.seq_q, case.seq_k)
    block_mask = create_block_mask(mod, 3, None, 4, layout.num_blocks * 16, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex warns that it is not compiled
        out = flex_attention(inputs.q, physical_kv(k_cache), physical_kv(v_cache), block_mask=block_mask,
                             scale=case.scale, enable_gqa=True)
    expected = naive_attention(inputs.q, inputs.k, inputs.v, case.mask, case.scale)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_backend_without_a_paged_path_is_unsupported_with_the_reason():
    df = harness.check(["xformers"], [DECODE], "cpu")
    assert set(df.status) <= {"unsupported", "unavailable"}


def test_unpaged_backend_reason_names_the_capability():
    class Plain(harness.Backend):
        name = "plain-test"

    reasons = Plain().can_run(DECODE, torch.device("cpu"))
    assert reasons == ["plain-test has no paged KV path (paged_kv=False)"]


# --- FlashAttention-2: flash_attn_with_kvcache ------------------------------------------------------------------
def _fake_flash_attn_with_kvcache(calls):
    """flash_attn_with_kvcache as flash-attn 2.8.3's flash_attn/flash_attn_interface.py documents it (signature and
    docstring): q (batch, seqlen, nheads, headdim); with a block_table the caches are (num_blocks, page_block_size,
    nheads_k, headdim) and "page_block_size must be a multiple of 256"; block_table (batch, max_num_blocks_per_seq)
    int32; cache_seqlens (batch,) int32; causal "aligned to the bottom right corner" of each sequence's
    (seqlen_q x cache_seqlens[b]) matrix - the rule harness.backends.flash_attn.fa2_visible encodes."""
    from harness.backends.flash_attn import fa2_visible

    def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                                cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                                softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
        calls.append(dict(causal=causal, window_size=window_size, k=k, softcap=softcap))
        batch, seq_q, heads, _ = q.shape
        _, page, kv_heads, _ = k_cache.shape
        assert page % 256 == 0 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
        assert block_table.dtype == torch.int32 and block_table.shape[0] == batch
        assert cache_seqlens.dtype == torch.int32 and cache_seqlens.shape == (batch,)
        out = torch.empty_like(q)
        for b in range(batch):
            n = int(cache_seqlens[b])
            keys = k_cache[block_table[b].long()].flatten(0, 1)[:n].float().repeat_interleave(heads // kv_heads, 1)
            values = v_cache[block_table[b].long()].flatten(0, 1)[:n].float().repeat_interleave(heads // kv_heads, 1)
            s = torch.einsum("qhd,khd->hqk", q[b].float(), keys) * softmax_scale
            s = s.masked_fill(~fa2_visible(seq_q, n, causal=causal, window_size=window_size)[0], float("-inf"))
            out[b] = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), values).to(q.dtype)
        return out

    return flash_attn_with_kvcache


def test_fa2_paged_call_is_flash_attn_with_kvcache_with_bottom_right_causal(monkeypatch):
    import sys
    import types

    from harness.backends.flash_attn import FlashAttn2

    calls = []
    fake = types.ModuleType("flash_attn")
    fake.flash_attn_with_kvcache = _fake_flash_attn_with_kvcache(calls)
    fake.flash_attn_func = fake.flash_attn_varlen_func = None
    monkeypatch.setitem(sys.modules, "flash_attn", fake)
    case = AttentionCase(2, 4, 4, 32, "fp32", kv_heads=2, seq_k=300, mask=CacheCausal((300, 161)), page_size=256)
    inputs = make_inputs(case)
    k_cache, v_cache, table, lengths = paged_inputs(case, inputs.k, inputs.v)
    backend = FlashAttn2()
    out = backend.forward(backend.to_layout(inputs.q), k_cache, v_cache, mask=case.mask, scale=case.scale,
                          prepared=backend.prepare(case, torch.device("cpu")), block_table=table,
                          cache_seqlens=lengths)
    expected = naive_attention(inputs.q, inputs.k, inputs.v, case.mask, case.scale)
    torch.testing.assert_close(backend.from_layout(out), expected, atol=1e-5, rtol=1e-5)
    assert calls == [dict(causal=True, window_size=(-1, -1), k=None, softcap=0.0)]


def test_fa2_page_size_rule_is_a_capability():
    from harness.backends.flash_attn import FlashAttn2

    assert FlashAttn2().can_run(VERIFY, torch.device("cuda")) == ["flash-attn needs page_size % 256 == 0; page_size=16"]
    ok = AttentionCase(1, 4, 1, 64, "bf16", seq_k=300, mask=CacheCausal((300,)), page_size=256)
    assert FlashAttn2().can_run(ok, torch.device("cuda")) == []


# --- xformers: PagedBlockDiagonalCausalWithOffsetPaddedKeysMask --------------------------------------------------
def test_xformers_paged_bias_materializes_to_cache_causal_over_the_physical_cache():
    """xformers 0.0.35 ops/fmha/attn_bias.py PagedBlockDiagonalCausalWithOffsetPaddedKeysMask.materialize lays the
    unpaged causal-with-offset mask out on the physical pages through the block table; it must equal CacheCausal
    read through the same table."""
    pytest.importorskip("xformers.ops.fmha.attn_bias")
    from harness.backends.xformers import xformers_paged_bias

    case = VERIFY
    table = paged_layout(case).block_table
    bias = xformers_paged_bias(case, table)
    page, max_blocks = case.page_size, table.shape[1]
    dense = bias.materialize((case.batch * case.seq_q, case.batch * max_blocks * page))
    expected = torch.zeros(dense.shape, dtype=torch.bool)
    visible = case.mask.materialize(case.seq_q, case.seq_k, batch=case.batch)[:, 0]      # (B, Sq, Sk) logical
    for b in range(case.batch):
        for j in range(case.seq_k):
            physical = int(table[b, j // page]) * page + j % page
            expected[b * case.seq_q:(b + 1) * case.seq_q, physical] = visible[b, :, j]
    assert torch.equal(torch.isfinite(dense), expected)


def test_xformers_dispatches_the_paged_bias_to_fa2_over_the_flash_attn_package_on_sm90():
    """With the flash_attn package xformers' fa2F takes the paged bias (flash.py 458-460); with torch's bundled flash
    no forward op does, and the reasons name every op."""
    pytest.importorskip("xformers.ops.fmha")
    from harness.backends.base import Unsupported
    from harness.backends.xformers import xformers_paged_plan
    from tests.unit.backends.test_xformers_dispatch import cuda_tensor, sm90

    case = AttentionCase(3, 8, 4, 128, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16)
    with sm90(bundled_flash=False):
        form = xformers_paged_plan(case, torch.device("cpu"), cuda_tensor)
    assert form.fw.NAME.startswith("fa2F") and form.gqa == "5d"
    with sm90(), pytest.raises(Unsupported, match="fa2F.*attn_bias type"):
        xformers_paged_plan(case, torch.device("cpu"), cuda_tensor)
