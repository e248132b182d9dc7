"""FlashAttention-2 `flash_attn_func` (varlen for key padding), layout (B, S, H, D), fp16/bf16 on sm80+."""

from __future__ import annotations

import torch

from harness.backends.base import CallPlan, FlashFamily, MaskForm, Unsupported, cuda_import_problem
from harness.backends.flash_attn_package import fa2_problem
from harness.backends.install import Install
from harness.backends.paged_gather import run_packed
from harness.backends.registry import register
from harness.cases.masks import CacheCausal, Causal, CausalBottomRight, Documents, KeyPadding, MaskSpec, SlidingWindow
from harness.cases.paged import cu_seqlens, mixed_step_queries
from harness.backends.serving import ServingKnob


def fa2_args(mask: MaskSpec | None, seq_q: int, seq_k: int, name: str = "FA2") -> dict:
    """Mask spec -> FA2 keywords {causal, window_size} (+ 'key_lengths', or 'cu_seqlens_q'/'cu_seqlens_k' of
    one batch element for Documents, for the varlen path); `name` is whose keywords these are, in a refusal.
    FA2 aligns causal and windows bottom-right (so top-left causal only when seq_q == seq_k), and its varlen
    causal bottom-right within each sequence, as Documents' is."""
    if mask is None:
        return {"causal": False, "window_size": (-1, -1)}
    if isinstance(mask, Documents):
        return {"causal": mask.causal, "window_size": (-1, -1), "cu_seqlens_q": mask.starts("q"),
                "cu_seqlens_k": mask.starts("k")}
    if isinstance(mask, CausalBottomRight) or (isinstance(mask, Causal) and seq_q == seq_k):
        return {"causal": True, "window_size": (-1, -1)}
    if isinstance(mask, Causal):
        raise Unsupported(f"{name} causal is bottom-right aligned; top-left causal with seq_q={seq_q} != "
                          f"seq_k={seq_k} has no {name} form")
    if isinstance(mask, SlidingWindow):
        return {"causal": False, "window_size": (mask.left, mask.right)}
    if isinstance(mask, KeyPadding):
        return {"causal": False, "window_size": (-1, -1), "key_lengths": mask.lengths}
    raise Unsupported(f"{name} has no form for mask {mask.id} (its varlen path aligns causal to each sequence's "
                      "own length, which differs from a padded top-left causal mask)")


def fa2_modifier_args(softcap: float | None = None, alibi_slopes: torch.Tensor | None = None) -> dict:
    """Modifiers -> FA2 keywords: softcap (0.0 = off) and alibi_slopes ((nheads,) fp32), as flash_attn_func and
    flash_attn_varlen_func take them (flash-attn 2.8.3 flash_attn/flash_attn_interface.py)."""
    return {"softcap": 0.0 if softcap is None else float(softcap),
            "alibi_slopes": None if alibi_slopes is None else alibi_slopes.float().contiguous()}


@register
class FlashAttn2(FlashFamily):
    name = "flash-attn"
    colour, marker = "#e377c2", "*"
    library = "FlashAttention-2"
    #: vLLM FLASH_ATTN with FlashAttention version 2 (vLLM's own build of the kernels, vllm_flash_attn; the version
    #: flag is --attention-config.flash_attn_version from 0.13.0, VLLM_FLASH_ATTN_VERSION before);
    #: transformers flash_attention_2 (4.36.0 on); SGLang has no FlashAttention-2 setting
    serving = (ServingKnob("vllm", "FLASH_ATTN", "0.10.2", also=("--attention-config.flash_attn_version=2",),
                           note="vLLM's own build of the FlashAttention-2 kernels"),
               ServingKnob("transformers", "flash_attention_2", "4.36.0"))
    install = Install("flash-attn==2.8.3", because="flash_attn_interface.py of 2.8.3 is what its calls were read against "
                      "(page sizes, softcap, alibi_slopes, varlen)",
                      builds_from_source="no wheel on PyPI: its sdist imports torch to build (so pip needs "
                      "--no-build-isolation) and compiles CUDA with nvcc (docs/gpu.md, FlashAttention-2 build)")
    package = "flash-attn"
    native_probes = frozenset({"causal", "mask", "dropout"})
    modifiers = frozenset({"softcap", "alibi"})
    modifier_refusals = {
        "sinks": ("FlashAttention-2 has no sink logit (FlashAttention-4 adds `learnable_sink=`; the hopper FA3 "
                  "interface has none)"),
        "bias": "FlashAttention-2 takes no bias tensor (FlashAttention-4's score_mod can add one)",
        "head_dim_v": "FlashAttention-2 needs v's head dim equal to q/k's (FlashAttention-3 accepts a different one)",
    }
    #: paged through flash_attn_with_kvcache(block_table=) ("page_block_size must be a multiple of 256", 2.8.3)
    paged_kv = True
    page_size_multiple = 256
    mixed_batch = True  # flash_attn_varlen_func(..., block_table=), q packed by cu_seqlens_q (fa2_mixed_plan)

    def unavailable_reason(self, device):
        """FlashAttention-2 is its interface module (which loads flash_attn_2_cuda), not the `flash_attn` name:
        flash-attn-4 installs a `flash_attn` namespace package without it."""
        hint = "FlashAttention-2 builds from source with CUDA only (docs/gpu.md)"
        problem = fa2_problem()
        if problem is not None:
            return f"{problem}; {hint}"
        return cuda_import_problem(self.name, device, "flash_attn.flash_attn_interface",
                                   "flash_attn.flash_attn_interface", hint, lambda major: major >= 8,
                                   "FlashAttention-2 needs sm80+")

    def native_causal(self, q, k, v, *, scale):
        from flash_attn.flash_attn_interface import flash_attn_func
        return flash_attn_func(q, k, v, softmax_scale=scale, causal=True)

    def native_mask(self, q, k, v, *, mask, scale):
        raise Unsupported("flash_attn_func takes no mask tensor (only causal, window_size, alibi_slopes, softcap, "
                          "varlen cu_seqlens)")

    def native_dropout(self, q, k, v, *, p, scale):
        from flash_attn.flash_attn_interface import flash_attn_func
        return flash_attn_func(q, k, v, dropout_p=p, softmax_scale=scale)

    def mask_form(self, case, device):
        args = fa2_args(case.mask, case.seq_q, case.seq_k)
        shown = {k: v for k, v in args.items() if k in ("causal", "window_size")}
        varlen = " + varlen" if any(k in args for k in ("key_lengths", "cu_seqlens_q")) else ""
        return MaskForm("native", 0, ", ".join(f"{k}={v}" for k, v in shown.items()) + varlen)

    def prepare(self, case, device, block_table=None) -> CallPlan:
        """FA2's keywords, and for its varlen path the int32 cu_seqlens and the kept keys' flat indices, on the
        device: the call does no host work and no host-device traffic (a boolean-mask gather would synchronize).
        `kwargs`: fa2_plan's (or fa2_mixed_plan's) arguments of the call; {'mode': 'paged'} for a paged case."""
        if case.page_size is not None and case.mask.mixed:  # varlen over the pages: the step's own cu_seqlens
            return CallPlan(op=f"{self.name} (varlen paged: q packed and scattered back inside the timed call)",
                            kwargs=fa2_mixed_plan(case, device))
        if case.page_size is not None:  # flash_attn_with_kvcache takes the block table and lengths as they come
            return CallPlan(op=self.name, kwargs={"mode": "paged"})
        return CallPlan(op=self.name, kwargs=fa2_plan(case, device))

    def modifier_path(self, case):
        return " + ".join(f"native {m}{'_slopes' if m == 'alibi' else ''}=" for m in ("softcap", "alibi")
                          if m in case.modifiers)

    def forward(self, q, k, v, *, mask, scale, prepared: CallPlan | None = None, softcap=None, alibi_slopes=None,
                block_table=None, cache_seqlens=None):
        from flash_attn.flash_attn_interface import flash_attn_func, flash_attn_varlen_func
        if block_table is not None and isinstance(mask, CacheCausal) and mask.mixed:
            plan = self.plan_for(prepared, q, k, v, mask=mask, scale=scale, block_table=block_table).kwargs
            return run_packed(q, plan["rows"], lambda packed: flash_attn_varlen_func(
                packed, k, v, plan["cu_q"], plan["cu_k"], plan["max_q"], plan["max_k"], softmax_scale=scale,
                causal=True, block_table=block_table))
        if block_table is not None:  # paged: k, v are the caches (num_blocks, page_size, kv_heads, head_dim)
            # its causal is bottom-right against each sequence's own cache_seqlens ("aligned to the bottom right
            # corner of the attention matrix"): query i sees keys j <= cache_seqlens[b] - seq_q + i, i.e. CacheCausal
            from flash_attn.flash_attn_interface import flash_attn_with_kvcache
            if not isinstance(mask, CacheCausal):
                raise Unsupported(f"flash_attn_with_kvcache has no form for mask {getattr(mask, 'id', mask)} over a "
                                  "paged cache")
            return flash_attn_with_kvcache(q, k, v, cache_seqlens=cache_seqlens, block_table=block_table,
                                           softmax_scale=scale, causal=True)
        plan = self.plan_for(prepared, q, k, v, mask=mask, scale=scale, softcap=softcap,
                             alibi_slopes=alibi_slopes).kwargs
        b, sq, h, d = q.shape
        sk = k.shape[1]
        modifiers = fa2_modifier_args(softcap, alibi_slopes)
        if plan["mode"] == "dense":
            return flash_attn_func(q, k, v, softmax_scale=scale, **plan["args"], **modifiers)
        q_flat = q.reshape(b * sq, h, d)
        k_flat, v_flat = k.reshape(b * sk, *k.shape[2:]), v.reshape(b * sk, *v.shape[2:])
        if plan["keep"] is not None:  # key padding: only each sequence's valid keys, packed
            k_flat, v_flat = k_flat.index_select(0, plan["keep"]), v_flat.index_select(0, plan["keep"])
        out = flash_attn_varlen_func(q_flat, k_flat, v_flat, plan["cu_q"], plan["cu_k"], plan["max_q"],
                                     plan["max_k"], softmax_scale=scale, **plan["args"], **modifiers)
        return out.reshape(b, sq, h, d)


def fa2_mixed_plan(case, device) -> dict:
    """flash_attn_varlen_func's arguments of a mixed serving step over a paged cache: cu_seqlens_q / cu_seqlens_k
    (int32, (batch + 1,)) from the query and cache lengths, their maxima, and `rows` (query_rows, to pack q)."""
    queries, lengths = mixed_step_queries(case, device), case.mask.lengths
    return {"mode": "paged-varlen", "cu_q": queries["cu_seqlens_q"], "cu_k": cu_seqlens(lengths).to(device),
            "max_q": queries["max_seqlen_q"], "max_k": max(lengths), "rows": queries["rows"]}


def fa2_plan(case, device) -> dict:
    """Everything flash_attn needs for `case` besides q, k and v (see FlashAttn2.prepare): mode 'dense' or
    'varlen'; for varlen cu_q/cu_k (int32, (batch + 1) or (documents x batch + 1)), max_q/max_k and `keep` (int64
    indices of the kept keys in the flattened (B * Sk) keys, or None)."""
    args = fa2_args(case.mask, case.seq_q, case.seq_k)
    b, sq, sk = case.batch, case.seq_q, case.seq_k
    as_int32 = dict(device=device, dtype=torch.int32)
    if "cu_seqlens_q" in args:  # Documents: every batch element's documents become varlen sequences
        cu_q, cu_k = args.pop("cu_seqlens_q"), args.pop("cu_seqlens_k")
        starts_q = [i * sq + s for i in range(b) for s in cu_q[:-1]] + [b * sq]
        starts_k = [i * sk + s for i in range(b) for s in cu_k[:-1]] + [b * sk]
        return {"mode": "varlen", "args": args, "cu_q": torch.tensor(starts_q, **as_int32),
                "cu_k": torch.tensor(starts_k, **as_int32), "max_q": max(case.mask.q_lengths),
                "max_k": max(case.mask.k_lengths), "keep": None}
    lengths = args.pop("key_lengths", None)
    if lengths is None:
        return {"mode": "dense", "args": args}
    # Varlen: queries all kept, keys packed per sequence to their valid length; cu_seqlens are int32.
    lens = torch.tensor(lengths, dtype=torch.int64)
    position = torch.arange(sk)
    keep = (torch.arange(b).view(-1, 1) * sk + position)[position < lens.view(-1, 1)]  # row-major: sequence order
    return {"mode": "varlen", "args": args, "cu_q": torch.arange(0, (b + 1) * sq, sq, **as_int32),
            "cu_k": cu_seqlens(lens).to(device), "max_q": sq, "max_k": max(lengths), "keep": keep.to(device)}
