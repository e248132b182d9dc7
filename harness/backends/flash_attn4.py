"""FlashAttention-4 (flash-attn-4, CuTe DSL; sm90 and sm100): flash_attn.cute.interface.flash_attn_func and
flash_attn_varlen_func, bshd. Read against flash-attn-4 4.0.0b36 (flash_attn/cute/interface.py, mask.py): causal is
bottom-right (mask.py: col_limit_right = row + 1 + seqlen_k - seqlen_q); paged KV through page_table (batch,
max_pages) int32 with seqused_k, K/V (num_pages, page_size, kv_heads, head_dim), any page size (page_size != tile_n
takes the non-TMA path); q varlen through cu_seqlens_q; softcap=, learnable_sink=, head_dim_v. Its public functions
take no q/k/v_descale in this version (only the private _flash_attn_fwd does), so FP8 is refused."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.backends.base import Backend, MaskForm, Plan, Unsupported
from harness.backends.registry import register
from harness.spec.case import AttentionCase
from harness.spec.masks import Causal, CausalBottomRight, SlidingWindow
from harness.spec.paged import cu_seqlens, query_rows


def _sm100_fits(d: int, dv: int) -> bool:
    return d % 8 == 0 and dv % 8 == 0 and ((8 <= d <= 128 and 8 <= dv <= 128) or (d, dv) in ((192, 128), (256, 256)))


#: what the kernels take per architecture (interface.py _validate_head_dims; the sm80/sm120 paths assert no paged
#: KV): head dims (q/k, v) allowed, as a predicate's description and the predicate
ARCHITECTURES = {
    9: {"name": "sm90", "head_dims": "8..256 (q/k and v), multiples of 8",
        "fits": lambda d, dv: 8 <= d <= 256 and 8 <= dv <= 256 and d % 8 == 0 and dv % 8 == 0},
    10: {"name": "sm100", "head_dims": "8..128, or (192, 128) DeepSeek, or (256, 256), multiples of 8",
         "fits": _sm100_fits},
    11: {"name": "sm110", "head_dims": "8..128, or (192, 128) DeepSeek, or (256, 256), multiples of 8",
         "fits": _sm100_fits},
}
FP8_REFUSAL = ("flash-attn-4 4.0.0b36's flash_attn_func / flash_attn_varlen_func take no q_descale / k_descale / "
               "v_descale (only its private _flash_attn_fwd does)")


def fa4_args(case: AttentionCase) -> dict:
    """The mask's keywords of a contiguous case (causal, window_size), or Unsupported with the reason."""
    mask = case.mask
    if mask is None:
        return {"causal": False}
    if isinstance(mask, CausalBottomRight) or (isinstance(mask, Causal) and case.seq_q == case.seq_k):
        return {"causal": True}
    if isinstance(mask, SlidingWindow) and case.seq_q == case.seq_k:  # its window is bottom-right aligned too
        return {"causal": False, "window_size": (None if mask.left < 0 else mask.left,
                                                  None if mask.right < 0 else mask.right)}
    raise Unsupported(f"FlashAttention-4 has no form for mask {mask.id} here (causal and windows are bottom-right; "
                      "key padding and documents are not translated)")


def fa4_paged_args(case: AttentionCase, device) -> dict:
    """flash_attn_varlen_func's arguments of a paged case besides q, K/V, page_table: seqused_k (the cache lengths),
    and for a mixed step cu_seqlens_q / max_seqlen_q with `rows` (the padded q's rows that carry a query)."""
    lengths = torch.tensor(case.mask.lengths, dtype=torch.int32, device=device)
    out = {"seqused_k": lengths, "causal": True, "rows": None}
    if case.mask.mixed:
        q_lens = case.mask.q_lens
        cu, rows = cu_seqlens(q_lens).to(device), query_rows(case).to(device)
        out.update(cu_seqlens_q=cu, max_seqlen_q=max(q_lens), rows=rows)
    return out


@dataclass
class Fa4Plan(Plan):
    """The call's keywords on the device; `paged`: flash_attn_varlen_func with a page_table."""

    kwargs: dict
    paged: bool = False


@register
class FlashAttn4(Backend):
    name = "flash-attn-4"
    colour, marker = "#637939", "<"
    layout = "bshd"
    dtypes = (torch.float16, torch.bfloat16)
    devices = ("cuda",)
    max_head_dim = 256
    package = "flash-attn-4"
    supports_backward = True
    modifiers = frozenset({"softcap", "sinks"})
    modifier_refusals = {"alibi": "FlashAttention-4 has no alibi_slopes (a score_mod could add it: not translated)",
                         "bias": "FlashAttention-4 takes no bias tensor (a score_mod with aux_tensors could: not "
                                 "translated)"}
    supports_head_dim_v = True
    paged_kv = True
    mixed_batch = True

    def unavailable_reason(self, device):
        """FlashAttention-4 is flash_attn.cute.interface (the `flash_attn` namespace flash-attn-4 installs); FA2's
        flash_attn.flash_attn_interface does not make it available, nor the reverse."""
        try:
            import flash_attn.cute.interface  # noqa: F401
        except Exception as exc:
            return (f"flash_attn.cute.interface not importable ({type(exc).__name__}: {exc}); pip install "
                    "flash-attn-4 (needs nvidia-cutlass-dsl)")
        if device.type != "cuda":
            return f"flash-attn-4 needs CUDA; device is {device.type}"
        major, minor = torch.cuda.get_device_capability(device)
        if major not in ARCHITECTURES:
            return (f"flash-attn-4 here is read for {', '.join(a['name'] for a in ARCHITECTURES.values())}; device is "
                    f"sm{major}{minor}")
        return None

    def not_supported_reasons(self, case):
        reasons = super().not_supported_reasons(case)
        if case.fp8_kv is not None:
            reasons.append(FP8_REFUSAL)
        if case.page_size is None:
            try:
                fa4_args(case)
            except Unsupported as exc:
                reasons.append(str(exc))
        return reasons

    def arch_reasons(self, case: AttentionCase, major: int) -> list[str]:
        """What architecture `major` (9, 10, 11) cannot take of `case`, from ARCHITECTURES."""
        arch = ARCHITECTURES[major]
        if arch["fits"](case.head_dim, case.head_dim_v):
            return []
        return [f"flash-attn-4 on {arch['name']} takes head dims {arch['head_dims']}; got ({case.head_dim}, "
                f"{case.head_dim_v})"]

    def can_run(self, case, device, *, backward=False, dropout=False):
        reasons = super().can_run(case, device, backward=backward, dropout=dropout)
        if device.type == "cuda" and torch.cuda.is_available():
            major = torch.cuda.get_device_capability(device)[0]
            reasons += self.arch_reasons(case, major) if major in ARCHITECTURES else []
        return reasons

    def mask_form(self, case, device):
        if case.page_size is not None:
            return MaskForm("native", 0, "page_table + seqused_k, causal" + (" + cu_seqlens_q" if case.mask.mixed
                                                                               else ""))
        return MaskForm("native", 0, ", ".join(f"{k}={v}" for k, v in fa4_args(case).items()))

    def prepare(self, case, device, block_table=None) -> Fa4Plan:
        """The call's keywords on the device, once (the block table arrives with each call)."""
        if case.page_size is not None:
            return Fa4Plan(op=f"{self.name} (varlen, page_table)", kwargs=fa4_paged_args(case, device), paged=True)
        return Fa4Plan(op=self.name, kwargs=fa4_args(case))

    def forward(self, q, k, v, *, mask, scale, prepared: Fa4Plan | None = None, softcap=None, sinks=None,
                block_table=None, cache_seqlens=None):
        from flash_attn.cute.interface import flash_attn_func, flash_attn_varlen_func

        plan = self.plan_for(prepared, q, k, v, mask=mask, scale=scale, softcap=softcap, sinks=sinks,
                             block_table=block_table)
        modifiers = {"softcap": softcap or 0.0, "learnable_sink": sinks}
        if not plan.paged:
            out = flash_attn_func(q, k, v, softmax_scale=scale, **plan.kwargs, **modifiers)
            return out[0] if isinstance(out, tuple) else out
        kwargs, rows = dict(plan.kwargs), plan.kwargs["rows"]
        del kwargs["rows"]
        b, sq, h, d = q.shape
        if rows is None:  # every sequence seq_q queries: q as a batch
            out = flash_attn_varlen_func(q, k, v, page_table=block_table, softmax_scale=scale, **kwargs, **modifiers)
            return out[0] if isinstance(out, tuple) else out
        packed = q.reshape(b * sq, h, d).index_select(0, rows)        # a mixed step: q packed by cu_seqlens_q
        out = flash_attn_varlen_func(packed, k, v, page_table=block_table, softmax_scale=scale, **kwargs, **modifiers)
        out = out[0] if isinstance(out, tuple) else out
        return q.new_zeros(b * sq, h, d).index_copy_(0, rows, out).reshape(b, sq, h, d)
