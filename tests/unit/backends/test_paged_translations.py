"""Each backend's paged-KV translation checked against the spec (CacheCausal over a shuffled block table) on CPU."""

import warnings

import pytest
import torch

import harness
from harness import AttentionCase
from harness.cases.case import make_inputs
from harness.cases.masks import CacheCausal, Causal, CausalBottomRight, Documents, KeyPadding, SlidingWindow
from harness.cases.paged import paged_inputs, paged_layout
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
    (seqlen_q x cache_seqlens[b]) matrix - the rule tests/unit/backends/fa2_model.fa2_visible encodes."""
    from tests.unit.backends.fa2_model import fa2_visible

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
    fake = types.ModuleType("flash_attn.flash_attn_interface")  # FA2's interface module, where the backend imports
    fake.flash_attn_with_kvcache = _fake_flash_attn_with_kvcache(calls)
    fake.flash_attn_func = fake.flash_attn_varlen_func = None
    package = types.ModuleType("flash_attn")
    package.flash_attn_interface = fake
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", fake)
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


# --- FlashInfer: plan() arguments and the wrappers' documented semantics ----------------------------------------
def flashinfer_visible(qo_len: int, kv_len: int, causal: bool, window_left: int) -> torch.Tensor:
    """FlashInfer 0.6.1's mask rules (data/include/flashinfer/attention/prefill.cuh: causal masks kv_idx + qo_len >
    kv_len + q_idx; variants.cuh: the window keeps kv_idx + qo_len + window_left >= kv_len + qo_idx), (qo, kv)."""
    q, kv = torch.arange(qo_len).view(-1, 1), torch.arange(kv_len).view(1, -1)
    ok = torch.ones(qo_len, kv_len, dtype=torch.bool)
    if causal:
        ok &= kv + qo_len <= kv_len + q
    if window_left >= 0:
        ok &= kv + qo_len + window_left >= kv_len + q
    return ok


def _documented_run(kind, args, q, *kv):
    """What a wrapper's run() computes from what plan() was given: request r's queries are q[qo_indptr[r]:...]
    (decode: q[r]); its keys the pages kv_indices[kv_indptr[r]:kv_indptr[r+1]] with kv_last_page_len[r] keys in the
    last (paged, NHD), or k[kv_indptr[r]:kv_indptr[r+1]] (ragged)."""
    if kind == "BatchDecodeWithPagedKVCacheWrapper":
        indptr, indices, last, page = args["indptr"], args["indices"], args["last_page_len"], args["page_size"]
        qo_indptr, causal = torch.arange(q.shape[0] + 1), False
    else:
        qo_indptr, causal = args["qo_indptr"], args["causal"]
        if kind == "BatchPrefillWithPagedKVCacheWrapper":
            indptr, indices = args["paged_kv_indptr"], args["paged_kv_indices"]
            last, page = args["paged_kv_last_page_len"], args["page_size"]
        else:
            indptr = args["kv_indptr"]
    out = torch.zeros(q.shape, dtype=torch.float32)
    for r in range(len(qo_indptr) - 1):
        if kind == "BatchPrefillWithRaggedKVCacheWrapper":
            keys, values = (t[indptr[r]:indptr[r + 1]] for t in kv)
        else:
            pages = indices[indptr[r]:indptr[r + 1]].long()
            n = (len(pages) - 1) * page + int(last[r])
            keys, values = (t[pages].flatten(0, 1)[:n] for t in kv)
        rows = q[qo_indptr[r]:qo_indptr[r + 1]].float()                              # (qo, H, D)
        g = q.shape[1] // keys.shape[1]
        keys, values = keys.float().repeat_interleave(g, 1), values.float().repeat_interleave(g, 1)
        s = torch.einsum("qhd,khd->hqk", rows, keys) * args["sm_scale"]
        s = s.masked_fill(~flashinfer_visible(len(rows), len(keys), causal, args["window_left"]), float("-inf"))
        out[qo_indptr[r]:qo_indptr[r + 1]] = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), values)
    return out.to(q.dtype)


@pytest.fixture
def fake_flashinfer(monkeypatch):
    """flashinfer's three wrappers replaced by recorders that bind every call to the real signature (a wrong keyword
    or position fails) and compute _documented_run; the real constructors pin host memory, which needs CUDA."""
    flashinfer = pytest.importorskip("flashinfer")
    import inspect

    calls = []

    def fake(real):
        class Recorder:
            def __init__(self, workspace, kv_layout="NHD", **kwargs):
                inspect.signature(real.__init__).bind(self, workspace, kv_layout=kv_layout, **kwargs)
                assert kv_layout == "NHD"

            def plan(self, *args, **kwargs):
                bound = inspect.signature(real.plan).bind(self, *args, **kwargs)
                bound.apply_defaults()
                self.args = dict(bound.arguments)
                calls.append((real.__name__, self.args))

            def run(self, q, *kv, **kwargs):
                inspect.signature(real.run).bind(self, q, *kv, **kwargs)
                return _documented_run(real.__name__, self.args, q, *(kv[0] if len(kv) == 1 else kv))

        return Recorder

    for name in ("BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
                 "BatchPrefillWithRaggedKVCacheWrapper"):
        monkeypatch.setattr(flashinfer, name, fake(getattr(flashinfer, name)))
    return calls


@pytest.mark.parametrize("case", [
    DECODE, VERIFY,
    AttentionCase(2, 4, 9, 32, "bf16", kv_heads=2, mask=Causal()),
    AttentionCase(2, 4, 5, 32, "bf16", seq_k=12, mask=CausalBottomRight()),
    AttentionCase(2, 4, 12, 32, "bf16", mask=SlidingWindow(3, 0)),
    AttentionCase(2, 4, 5, 32, "bf16", seq_k=12, mask=KeyPadding((7, 12))),
    AttentionCase(1, 4, 12, 32, "bf16", mask=Documents((5, 7), causal=True)),
], ids=lambda c: c.id)
def test_flashinfer_wrappers_planned_from_a_case_compute_the_spec(fake_flashinfer, case):
    from harness.backends.flashinfer import FlashInfer

    backend, cpu = FlashInfer(), torch.device("cpu")
    inputs = make_inputs(case)
    plan = backend.prepare(case, cpu)
    q = backend.to_layout(inputs.q).contiguous()
    if case.page_size is not None:
        k_cache, v_cache, table, lengths = paged_inputs(case, inputs.k, inputs.v)
        out = backend.forward(q, k_cache, v_cache, mask=case.mask, scale=case.scale, prepared=plan,
                              block_table=table, cache_seqlens=lengths)
    else:
        k, v = (backend.to_layout(t).contiguous() for t in (inputs.k, inputs.v))
        out = backend.forward(q, k, v, mask=case.mask, scale=case.scale, prepared=plan)
    expected = naive_attention(*(t.float() for t in inputs[:3]), case.mask, case.scale)
    torch.testing.assert_close(backend.from_layout(out).float(), expected, atol=2e-2, rtol=2e-2)
    (wrapper, args), = fake_flashinfer
    assert wrapper == {"decode": "BatchDecodeWithPagedKVCacheWrapper", "paged-prefill":
                       "BatchPrefillWithPagedKVCacheWrapper", "ragged": "BatchPrefillWithRaggedKVCacheWrapper"}[plan.kind]
    assert args["q_data_type"] == case.dtype and args["sm_scale"] == case.scale


def test_flashinfer_paged_plan_args_are_the_block_table_in_csr_form():
    from harness.backends.flashinfer import flashinfer_plan

    plan = flashinfer_plan(VERIFY)
    table = paged_layout(VERIFY).block_table
    args = plan.args
    assert plan.kind == "paged-prefill" and plan.causal
    assert args["qo_indptr"].tolist() == [0, 4, 8, 12]
    assert args["kv_indptr"].tolist() == [0, 3, 5, 8]                          # ceil(45/16), ceil(20/16), ceil(33/16)
    assert args["kv_indices"].tolist() == table[0, :3].tolist() + table[1, :2].tolist() + table[2, :3].tolist()
    assert args["kv_last_page_len"].tolist() == [13, 4, 1]
    assert all(t.dtype == torch.int32 for t in args.values())
    assert flashinfer_plan(DECODE).kind == "decode"


def test_flashinfer_refuses_what_it_has_no_form_for():
    from harness.backends.flashinfer import FlashInfer

    reasons = FlashInfer().can_run(AttentionCase(2, 4, 5, 64, "bf16", seq_k=9, mask=Causal()), torch.device("cuda"))
    assert any("FlashInfer has no form for mask causal" in r for r in reasons)


def test_flashinfer_unavailable_reasons(monkeypatch, tmp_path):
    import builtins
    import importlib.util

    from harness.backends import flashinfer as module

    real_import = builtins.__import__

    def no_flashinfer(name, *args, **kwargs):
        if name == "flashinfer":
            raise ImportError("No module named 'flashinfer'")
        return real_import(name, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(builtins, "__import__", no_flashinfer)
        assert "flashinfer not importable" in module.FlashInfer().unavailable_reason(torch.device("cuda"))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(module.shutil, "which", lambda name: None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setattr(module.os.path, "exists", lambda p: str(p).startswith(str(tmp_path)))
    assert module.jit_problem().startswith("FlashInfer JIT-compiles its kernels with nvcc")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert module.jit_problem() is None


def test_flashinfer_says_it_needs_cuda_on_the_cpu():
    pytest.importorskip("flashinfer")
    from harness.backends.flashinfer import FlashInfer

    assert FlashInfer().unavailable_reason(torch.device("cpu")) == "FlashInfer kernels need CUDA; device is cpu"
