"""FlashAttention-3 (the hopper build's `flash_attn_interface`, sm90): contiguous, paged, mixed and FP8 Q/K/V calls."""

from __future__ import annotations

import torch

from harness.backends.base import (BackwardUnsupported, CallPlan, FlashFamily, MaskForm, Unsupported,
                                   cuda_import_problem, refusal)
from harness.backends.flash_attn import fa2_args
from harness.backends.install import Install
from harness.backends.paged_gather import paged_call_args, run_packed
from harness.backends.registry import register
from harness.cases.case import AttentionCase
from harness.backends.serving import ServingKnob

FP8_REFUSAL = ("FlashAttention-3's FP8 path takes Q, K and V all in FP8 (the kernel's dtype is q's, with "
               "q/k/v_descale); an FP8 KV cache with bf16/fp16 queries has no form")
#: flash_api.cpp mha_fwd: "If V headdim is different from Q/K dim, we only support Q/K headdim in (128, 192] and V
#: headdim in (96, 128], or (Q/K <= 64 and V <= 512)"
HEAD_DIM_V_REFUSAL = ("FlashAttention-3 takes a V head dim other than Q/K's only for Q/K in (128, 192] with V in "
                      "(96, 128], or Q/K <= 64 with V <= 512")
#: flash_api.cpp mha_bwd: "params.dv = head_size;  // We don't support hdim_v being different from hdim_qk for now"
BACKWARD_HEAD_DIM_V = "FlashAttention-3's backward takes no V head dim other than Q/K's (flash_api.cpp mha_bwd)"


def fa3_args(case: AttentionCase) -> dict:
    """The mask's keywords of a contiguous case for flash_attn_func (causal, window_size: FA2's, fa2_args), or
    Unsupported with the reason (key padding and documents' varlen forms are not translated here)."""
    args = fa2_args(case.mask, case.seq_q, case.seq_k, "FlashAttention-3")
    if set(args) - {"causal", "window_size"}:
        raise Unsupported(f"FlashAttention-3 has no form for mask {case.mask.id} here (causal and windows only; key "
                          "padding and documents through flash_attn_varlen_func are not translated)")
    return args


@register
class FlashAttn3(FlashFamily):
    name = "flash-attn-3"
    colour, marker = "#393b79", "d"
    library = "FlashAttention-3"
    #: vLLM FLASH_ATTN, version 3 by default on sm90 (fa_utils.get_flash_attn_version); SGLang fa3 (sgl-kernel's
    #: build, 0.4.6.post4 on); transformers flash_attention_3 (4.53.0 on)
    serving = (ServingKnob("vllm", "FLASH_ATTN", "0.10.2", also=("--attention-config.flash_attn_version=3",),
                           note="vLLM's own build of the FlashAttention-3 kernels"),
               ServingKnob("sglang", "fa3", "0.4.6.post4", note="sgl-kernel's build of the FlashAttention-3 kernels"),
               ServingKnob("transformers", "flash_attention_3", "4.53.0"))
    install = Install("flash-attn-3", because="no release on any package index: any build of flash-attention's hopper/ "
                      "(its interface was read at commit 01afd16)",
                      builds_from_source="on no package index: build flash-attention's hopper/ with nvcc on an sm90 "
                      "node, then the extra is met")
    package = "flash-attn-3"
    supports_backward = True  # flash_attn_func's (the paged call has none; paged cases are forward-only anyway)
    modifiers = frozenset({"softcap"})
    modifier_refusals = {
        "sinks": "FlashAttention-3's hopper interface (commit 01afd16) has no learnable sink (FlashAttention-4 has "
                 "learnable_sink=)",
        "alibi": "FlashAttention-3's hopper interface takes no alibi_slopes",
        "bias": "FlashAttention-3 takes no bias tensor",
    }
    supports_head_dim_v = True
    paged_kv = True
    mixed_batch = True
    fp8_kv = True  # FP8 Q, K and V together (q/k/v_descale); an FP8 cache with bf16 queries is refused
    fp8_q = True

    def unavailable_reason(self, device):
        """FlashAttention-3 is the hopper build's top-level `flash_attn_interface`, not a `flash_attn` package."""
        return cuda_import_problem(self.name, device, "flash_attn_interface",
                                   "flash_attn_interface (FlashAttention-3, hopper/)",
                                   "it builds from flash-attention's hopper/ with CUDA on sm90",
                                   lambda major: major == 9, "flash-attn-3 (hopper build) runs on sm90")

    def not_supported_reasons(self, case):
        reasons = super().not_supported_reasons(case)
        if case.fp8_kv is not None and not case.fp8_q:
            reasons.append(FP8_REFUSAL)
        align = 16 if case.fp8_q else 8  # flash_api.cpp: "head_size should be a multiple of" 16 for FP8, else 8
        if case.head_dim % align or case.head_dim_v % align:
            reasons.append(f"FlashAttention-3 needs head dims that are multiples of {align}"
                           f"{' (FP8)' if case.fp8_q else ''}; got ({case.head_dim}, {case.head_dim_v})")
        d, dv = case.head_dim, case.head_dim_v
        if dv != d and not ((128 < d <= 192 and 96 < dv <= 128) or (d <= 64 and dv <= 512)):
            reasons.append(f"{HEAD_DIM_V_REFUSAL}; got ({d}, {dv})")
        return reasons + (refusal(fa3_args, case) if case.page_size is None else [])

    def mask_form(self, case, device):
        if case.page_size is not None:
            mixed = " + cu_seqlens_q" if case.mask.mixed else ""
            return MaskForm("native", 0, f"page_table + cache_seqlens, causal{mixed}")
        return MaskForm("native", 0, ", ".join(f"{k}={v}" for k, v in fa3_args(case).items()))

    def modifier_path(self, case):
        return "native softcap=" if case.softcap is not None else ""

    def prepare(self, case, device, block_table=None) -> CallPlan:
        """The call's keywords on the device, once (the block table, lengths and FP8 scales arrive with each call)."""
        fp8 = " FP8 Q/K/V with q/k/v_descale" if case.fp8_q else ""
        if case.page_size is not None:
            return CallPlan(op=f"{self.name} (flash_attn_with_kvcache, page_table{',' if fp8 else ''}{fp8})",
                            kwargs=paged_call_args(case, device), paged=True)
        return CallPlan(op=f"{self.name} (flash_attn_func{',' if fp8 else ''}{fp8})", kwargs=fa3_args(case))

    def forward(self, q, k, v, *, mask, scale, prepared: CallPlan | None = None, softcap=None, block_table=None,
                cache_seqlens=None, k_scale=None, v_scale=None, q_scale=None):
        from flash_attn_interface import flash_attn_func, flash_attn_with_kvcache
        plan = self.plan_for(prepared, q, k, v, mask=mask, scale=scale, softcap=softcap, block_table=block_table)
        kwargs = dict(plan.kwargs, softcap=0.0 if softcap is None else float(softcap))
        if q_scale is not None:  # FP8: the descales per (sequence, kv head), views of the case's scales
            # q_descale / k_descale / v_descale as FA3 takes them, (batch, num_heads_k) float32 ("(b, h_k), not (b, h)",
            # flash_api.cpp), from scales (1,) or (kv_heads,): broadcast views the kernel reads through their strides
            kwargs.update({f"{n}_descale": s.float().view(1, -1).expand(q.shape[0], k.shape[-2])
                           for n, s in (("q", q_scale), ("k", k_scale), ("v", v_scale))})
        if not plan.paged:
            if v.shape[-1] != q.shape[-1] and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
                raise BackwardUnsupported(BACKWARD_HEAD_DIM_V)
            out = flash_attn_func(q, k, v, softmax_scale=scale, **kwargs)
            return out[0] if isinstance(out, tuple) else out
        rows = kwargs.pop("rows")  # a mixed step: q packed by cu_seqlens_q

        def call(x):
            return flash_attn_with_kvcache(x, k, v, cache_seqlens=cache_seqlens, page_table=block_table,
                                           softmax_scale=scale, **kwargs)

        return call(q) if rows is None else run_packed(q, rows, call)
