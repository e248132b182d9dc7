"""FlashAttention-3 (the hopper build: `flash_attn_interface`, CUDA extension flash_attn_3._C; sm90): paged KV through
flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=, page_table=, causal=True), a mixed serving step with
cu_seqlens_q / max_seqlen_q. Read against Dao-AILab/flash-attention hopper/flash_attn_interface.py (stored at commit
01afd16): "page_block_size can be arbitrary"; causal "aligned to the bottom right corner"; q_descale/k_descale/
v_descale for FP8, whose kernel dtype is q's (FP8 Q, K and V together, bf16 output). Contiguous cases are not
translated here yet (flash_attn_func / flash_attn_varlen_func): they are refused with that reason."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.backends.base import Backend, MaskForm, Plan, Unsupported
from harness.backends.registry import register
from harness.spec.case import AttentionCase
from harness.spec.paged import cu_seqlens, query_rows

#: architectures the hopper build compiles for, and what it takes there (head dims rounded up to 64/96/128/192/256)
ARCHITECTURES = {9: {"name": "sm90", "max_head_dim": 256}}
FP8_REFUSAL = ("FlashAttention-3's FP8 path takes Q, K and V all in FP8 (the kernel's dtype is q's, with "
               "q/k/v_descale); an FP8 KV cache with bf16/fp16 queries has no form")
CONTIGUOUS_REFUSAL = "flash-attn-3 here translates paged cases only (flash_attn_with_kvcache with page_table)"


def fa3_paged_args(case: AttentionCase, device) -> dict:
    """flash_attn_with_kvcache's keywords of a paged case besides q, the caches and page_table: causal, and for a
    mixed step cu_seqlens_q / max_seqlen_q with `rows` (the padded q's rows that carry a query, packed)."""
    out = {"causal": True, "rows": None}
    if case.mask.mixed:
        q_lens = case.mask.q_lens
        cu, rows = cu_seqlens(q_lens).to(device), query_rows(case).to(device)
        out.update(cu_seqlens_q=cu, max_seqlen_q=max(q_lens), rows=rows)
    return out


@dataclass
class Fa3Plan(Plan):
    kwargs: dict


@register
class FlashAttn3(Backend):
    name = "flash-attn-3"
    colour, marker = "#393b79", "d"
    layout = "bshd"
    dtypes = (torch.float16, torch.bfloat16)
    devices = ("cuda",)
    max_head_dim = 256
    package = "flash-attn-3"
    supports_backward = False  # its paged call, flash_attn_with_kvcache: "Does not support backward pass"
    supports_head_dim_v = True
    paged_kv = True
    mixed_batch = True

    def unavailable_reason(self, device):
        """FlashAttention-3 is the top-level `flash_attn_interface` of the hopper build, not FA2's or FA4's
        `flash_attn` package."""
        try:
            import flash_attn_interface  # noqa: F401
        except Exception as exc:
            return (f"flash_attn_interface (FlashAttention-3, hopper/) not importable ({type(exc).__name__}: {exc}); "
                    "it builds from flash-attention's hopper/ with CUDA on sm90")
        if device.type != "cuda":
            return f"flash-attn-3 needs CUDA; device is {device.type}"
        major, minor = torch.cuda.get_device_capability(device)
        if major not in ARCHITECTURES:
            return f"flash-attn-3 (hopper build) runs on sm90; device is sm{major}{minor}"
        return None

    def not_supported_reasons(self, case):
        reasons = super().not_supported_reasons(case)
        if case.fp8_kv is not None:
            reasons.append(FP8_REFUSAL)
        if case.page_size is None:
            reasons.append(CONTIGUOUS_REFUSAL)
        return reasons

    def mask_form(self, case, device):
        return MaskForm("native", 0, "page_table + cache_seqlens, causal" + (
            " + cu_seqlens_q" if case.page_size is not None and case.mask.mixed else ""))

    def prepare(self, case, device, block_table=None) -> Fa3Plan:
        """The call's keywords on the device, once (the block table and lengths arrive with each call)."""
        if case.page_size is None:
            raise Unsupported(CONTIGUOUS_REFUSAL)
        return Fa3Plan(op=f"{self.name} (flash_attn_with_kvcache, page_table)", kwargs=fa3_paged_args(case, device))

    def forward(self, q, k, v, *, mask, scale, prepared: Fa3Plan | None = None, block_table=None,
                cache_seqlens=None):
        from flash_attn_interface import flash_attn_with_kvcache

        plan = self.plan_for(prepared, q, k, v, mask=mask, scale=scale, block_table=block_table)
        kwargs = dict(plan.kwargs)
        rows = kwargs.pop("rows")
        if rows is None:
            return flash_attn_with_kvcache(q, k, v, cache_seqlens=cache_seqlens, page_table=block_table,
                                           softmax_scale=scale, **kwargs)
        b, sq, h, d = q.shape  # a mixed step: q packed by cu_seqlens_q, the output scattered back
        packed = q.reshape(b * sq, h, d).index_select(0, rows)
        out = flash_attn_with_kvcache(packed, k, v, cache_seqlens=cache_seqlens, page_table=block_table,
                                      softmax_scale=scale, **kwargs)
        return q.new_zeros(b * sq, h, v.shape[-1]).index_copy_(0, rows, out).reshape(b, sq, h, v.shape[-1])
