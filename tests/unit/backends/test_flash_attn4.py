"""FlashAttention-4's translation against stand-ins bound to the real signatures of flash-attn-4 4.0.0b36's
flash_attn/cute/interface.py (flash_attn_func, flash_attn_varlen_func; read from the wheel, which is pure Python but
imports nvidia-cutlass-dsl, not installed here) with its documented semantics: q/k/v (batch, seqlen, heads, hdim) or
varlen (total_q, heads, hdim) by cu_seqlens_q; page_table (batch, max_pages) int32 with seqused_k and K/V (num_pages,
page_size, kv_heads, hdim); causal bottom-right per sequence (mask.py: col_limit_right = row + 1 + seqlen_k -
seqlen_q); softcap on the scaled scores; score_mod called as softmax.py's call_score_mod calls it (on the scores
already multiplied by softmax_scale, with seqlen_info and aux_tensors), softcap= and score_mod never both given
(interface.py asserts). Capabilities per architecture and every refusal's reason."""

import inspect
import sys
import types
from functools import lru_cache

import pytest
import torch

from harness import AttentionCase
from harness.oracle.baseline import naive_attention
from harness.cases.case import make_inputs
from harness.backends.base import BackwardUnsupported
from harness.cases.masks import CacheCausal, Causal, CausalBottomRight, KeyPadding
from harness.cases.modifiers import alibi_bias, alibi_slopes, softcap_scores
from harness.cases.paged import paged_inputs


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


class TorchOps:
    """modified_scores' operations on torch tensors, the stand-ins of the CUTLASS DSL's TensorSSA values."""

    def offset(self, seqlen_info):
        return seqlen_info.seqlen_k - seqlen_info.seqlen_q

    def distance(self, q_idx, offset, kv_idx):
        return (q_idx + offset - kv_idx).abs().float()

    def tanh(self, x):
        return torch.tanh(x)

    def gather(self, tensor, *indices):
        return tensor[indices].float()


@lru_cache(maxsize=1)
def torch_dsl():
    return TorchOps(), lambda fn: fn


def _attend(q, keys, values, scale, causal, softcap, score_mod=None, aux_tensors=None, batch_idx=0):
    """One sequence: q (n_q, H, D), keys/values (n_k, Hkv, D); bottom-right causal; softcap on scaled scores; a
    score_mod called as call_score_mod calls it, on the scaled scores, before the mask."""
    g = q.shape[1] // keys.shape[1]
    keys, values = keys.float().repeat_interleave(g, 1), values.float().repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q.float(), keys) * scale
    if softcap:
        assert score_mod is None, "softcap and score_mod cannot be used together"
        s = softcap * torch.tanh(s / softcap)
    n_q, n_k = q.shape[0], keys.shape[0]
    if score_mod is not None:
        h, i, j = (torch.arange(n).view(shape) for n, shape in ((q.shape[1], (-1, 1, 1)), (n_q, (1, -1, 1)),
                                                                  (n_k, (1, 1, -1))))
        s = score_mod(s, torch.tensor(batch_idx), h, q_idx=i, kv_idx=j,
                      seqlen_info=types.SimpleNamespace(seqlen_q=n_q, seqlen_k=n_k), aux_tensors=aux_tensors or ())
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
        return torch.stack([_attend(a["q"][b], a["k"][b], a["v"][b], a["softmax_scale"], a["causal"], a["softcap"],
                                    a["score_mod"], a["aux_tensors"], b) for b in range(a["q"].shape[0])])

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
    from harness.backends.flash_attn4 import BIAS_BACKWARD_REFUSAL, FP8_REFUSAL, FlashAttn4

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
    for modifiers in ({"alibi": True}, {"bias": "full"}, {"softcap": 5.0, "alibi": True, "bias": "head"}):
        assert backend.modifier_reasons(AttentionCase(2, 4, 8, 32, "bf16", **modifiers)) == []
    hd256 = AttentionCase(1, 4, 16, 256, "bf16", alibi=True)
    assert backend.arch_backward_reasons(hd256, 9) == []
    assert "dedicated hd256 kernel, which takes no softcap, learnable_sink or score_mod; case has alibi" in \
        backend.arch_backward_reasons(hd256, 10)[0]
    assert backend.arch_backward_reasons(AttentionCase(1, 4, 16, 256, "bf16"), 10) == []
    bias = AttentionCase(2, 4, 8, 32, "bf16", bias="head")
    assert backend.can_run(bias, torch.device("cpu"), backward=True)[-1] == \
        f"flash-attn-4 has no bias backward: {BIAS_BACKWARD_REFUSAL}"
    assert not any("backward" in r for r in backend.can_run(bias, torch.device("cpu")))


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


def test_score_mod_math_is_the_specs_alibi_bias_and_cap():
    """modified_scores with torch stand-ins for the SSA values equals the spec's formulas (modifiers.alibi_bias,
    softcap_scores, the bias added) at every (b, h, i, j), seq_q != seq_k (bottom-right ALiBi), both bias kinds; and
    score_grad is the cap's derivative (autograd's) and 1 without a cap."""
    from harness.backends.flash_attn4 import modified_scores, score_grad

    ops, (b, h, sq, sk) = TorchOps(), (2, 3, 5, 9)
    s = torch.randn(b, h, sq, sk, dtype=torch.float64) * 4
    slopes, full = alibi_slopes(h).double(), torch.randn(b, h, sq, sk, dtype=torch.float64)
    bi, hi, qi, ki = (torch.arange(n).view(*[-1 if d == k else 1 for d in range(4)]) for k, n in enumerate((b, h, sq,
                                                                                                            sk)))
    info = types.SimpleNamespace(seqlen_q=sq, seqlen_k=sk)
    for cap, kind in ((None, "full"), (3.0, "head"), (3.0, None)):
        bias = full if kind == "full" else full[:1]
        aux = (slopes, bias) if kind else (slopes,)
        got = modified_scores(s, bi, hi, qi, ki, ops.offset(info), aux, ops=ops, softcap=cap, alibi=True, bias=kind)
        want = (softcap_scores(s, cap) if cap else s) + alibi_bias(slopes, sq, sk, dtype=torch.float64)
        want = want + (bias if kind else 0)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)  # the slopes and distances in Float32, as the DSL
    x = s.clone().requires_grad_()
    softcap_scores(x, 3.0).sum().backward()
    torch.testing.assert_close(score_grad(torch.ones_like(s), s, ops=ops, softcap=3.0), x.grad)
    assert score_grad(s, s * 7, ops=ops, softcap=None) is s


@pytest.mark.parametrize("case", [
    AttentionCase(2, 4, 12, 32, "bf16", kv_heads=2, seq_k=20, mask=CausalBottomRight(), alibi=True),
    AttentionCase(2, 4, 12, 32, "bf16", seq_k=20, alibi=True, bias="full", softcap=4.0),
    AttentionCase(2, 4, 16, 32, "bf16", mask=Causal(), bias="head", sinks=False),
], ids=lambda c: c.id)
def test_fa4_score_mod_calls_compute_the_spec(fa4, monkeypatch, case):
    """ALiBi / bias / cap reach flash_attn_func as one score_mod pair with aux_tensors [slopes, bias] and softcap=0.0;
    a fake applying that score_mod as call_score_mod does (torch stand-ins for the DSL) matches the oracle."""
    from harness.backends import flash_attn4
    from harness.backends.flash_attn4 import FlashAttn4

    monkeypatch.setattr(flash_attn4, "cute_dsl", torch_dsl)
    backend, inputs = FlashAttn4(), make_inputs(case)
    plan = backend.prepare(case, torch.device("cpu"))
    q, k, v = (backend.to_layout(t).contiguous() for t in inputs[:3])
    slopes = alibi_slopes(case.heads) if case.alibi else None
    with torch.no_grad():
        out = backend.forward(q, k, v, mask=case.mask, scale=case.scale, prepared=plan, softcap=case.softcap,
                              alibi_slopes=slopes, bias=None if inputs.bias is None else inputs.bias.requires_grad_())
    expected = naive_attention(*(t.float() for t in inputs[:3]), case.mask, case.scale, softcap=case.softcap,
                               alibi_slopes=slopes, bias=None if inputs.bias is None else inputs.bias.float())
    torch.testing.assert_close(backend.from_layout(out).float(), expected, atol=2e-2, rtol=2e-2)
    (kind, args), = fa4
    assert args["softcap"] == 0.0 and args["score_mod"] is not None and args["score_mod_bwd"] is not None
    assert [t.shape for t in args["aux_tensors"]] == [t.shape for t in (slopes, inputs.bias) if t is not None]
    assert not any(t.requires_grad for t in args["aux_tensors"])  # torch's DLPack export refuses those
    assert backend.modifier_path(case).startswith("score_mod (")
    inspect.signature(args["score_mod_bwd"]).bind(0, 0, 0, 0, q_idx=0, kv_idx=0, seqlen_info=None, aux_tensors=())


def test_fa4_bias_backward_is_refused_before_the_call(fa4, monkeypatch):
    """With gradients required, a bias case raises BackwardUnsupported (its forward then runs alone); FA4 is not
    called, since it would return dq/dk/dv and no dbias."""
    from harness.backends import flash_attn4
    from harness.backends.flash_attn4 import BIAS_BACKWARD_REFUSAL, FlashAttn4

    monkeypatch.setattr(flash_attn4, "cute_dsl", torch_dsl)
    case = AttentionCase(1, 2, 8, 16, "bf16", bias="full")
    backend, inputs = FlashAttn4(), make_inputs(case)
    plan = backend.prepare(case, torch.device("cpu"))
    q, k, v = (backend.to_layout(t).contiguous().requires_grad_() for t in inputs[:3])
    with pytest.raises(BackwardUnsupported, match="no dbias"):
        backend.forward(q, k, v, mask=None, scale=case.scale, prepared=plan, bias=inputs.bias.requires_grad_())
    assert fa4 == [] and BIAS_BACKWARD_REFUSAL in plan.backward_refused
