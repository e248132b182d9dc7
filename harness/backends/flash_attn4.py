"""FlashAttention-4 (flash-attn-4, CuTe DSL; sm90/sm100): flash_attn.cute.interface's two calls, bshd, paged too."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from harness.backends.base import (BackwardUnsupported, CallPlan, FlashFamily, MaskForm, Unsupported,
                                   cuda_import_problem, refusal)
from harness.backends.install import Install
from harness.backends.paged_gather import paged_call_args, run_packed
from harness.backends.registry import register
from harness.cases.case import AttentionCase
from harness.cases.masks import Causal, CausalBottomRight, SlidingWindow
from harness.backends.serving import ServingKnob


def _sm100_fits(d: int, dv: int) -> bool:
    return d % 8 == 0 and dv % 8 == 0 and ((8 <= d <= 128 and 8 <= dv <= 128) or (d, dv) in ((192, 128), (256, 256)))


#: head dims (q/k, v) each architecture takes (interface.py _validate_head_dims), described and as a predicate;
#: `plain_backward_dims`: those whose backward (the dedicated hd256 kernel) takes no modifier
ARCHITECTURES = {
    9: {"name": "sm90", "head_dims": "8..256 (q/k and v), multiples of 8",
        "fits": lambda d, dv: 8 <= d <= 256 and 8 <= dv <= 256 and d % 8 == 0 and dv % 8 == 0,
        "plain_backward_dims": ()},
    **{major: {"name": f"sm{major}0", "head_dims": "8..128, or (192, 128) DeepSeek, or (256, 256), multiples of 8",
               "fits": _sm100_fits, "plain_backward_dims": ((256, 256),)} for major in (10, 11)},
}
FP8_REFUSAL = ("flash-attn-4 4.0.0b36's flash_attn_func / flash_attn_varlen_func take no q_descale / k_descale / "
               "v_descale (only its private _flash_attn_fwd does)")
BIAS_BACKWARD_REFUSAL = ("flash-attn-4 4.0.0b36 gives aux_tensors no gradient (FlashAttnFunc.backward returns None for "
                         "them), so the bias input would get no dbias")


# ALiBi and the bias as a score_mod: it sees the scaled score, one element at a time with aux_tensors, and replaces
# softcap= (FA4 asserts not both), so the cap is folded in (docs/design/backends.md, flash_attn4.py).
def modified_scores(score, batch_idx, head_idx, q_idx, kv_idx, offset, aux_tensors, *, ops, softcap: float | None,
                    alibi: bool, bias: str | None):
    """The spec's modifiers (harness.cases.modifiers) on the scaled score s, with the DSL's operations `ops`:
    s <- c * tanh(s / c); s <- s - slope_h * |i + offset - j| (offset = seq_k - seq_q: bottom-right, as
    modifiers.alibi_term); s <- s + bias[b or 0, h, i, j]. aux_tensors: the slopes (heads,) float32 when `alibi`,
    then the bias (batch or 1, heads, seq_q, seq_k) when `bias` ("full" indexed by b, "head" by 0)."""
    if softcap is not None:
        score = ops.tanh(score / softcap) * softcap
    if alibi:
        score = score - ops.gather(aux_tensors[0], head_idx) * ops.distance(q_idx, offset, kv_idx)
    if bias is not None:
        b = batch_idx if bias == "full" else 0
        score = score + ops.gather(aux_tensors[1 if alibi else 0], b, head_idx, q_idx, kv_idx)
    return score


def score_grad(grad, score, *, ops, softcap: float | None):
    """d(modified score)/d(scaled score) times `grad`: the cap's 1 - tanh^2(s / c); ALiBi and the bias add terms
    that do not depend on s (as utils.create_softcap_scoremod_bwd in 4.0.0b36)."""
    if softcap is None:
        return grad
    t = ops.tanh(score / softcap)
    return grad * (1.0 - t * t)


class CuteOps:
    """The operations modified_scores needs, in the CUTLASS DSL, as FA4's own score_mods write them (tests/cute/
    score_mod_definitions.py, utils.create_softcap_scoremod)."""

    def __init__(self):
        import cutlass
        import cutlass.cute as cute
        from cutlass._mlir.dialects import math as mlir_math
        from flash_attn.cute.utils import scalar_to_ssa
        self.cutlass, self.cute, self.mlir_math, self.scalar_to_ssa = cutlass, cute, mlir_math, scalar_to_ssa

    def __repr__(self) -> str:  # FA4 keys its compile cache on repr() of a score_mod's closure cells
        return "CuteOps"

    def offset(self, seqlen_info):
        return self.scalar_to_ssa(seqlen_info.seqlen_k - seqlen_info.seqlen_q, self.cutlass.Int32)

    def distance(self, q_idx, offset, kv_idx):
        d = q_idx + offset - kv_idx
        return self.cute.TensorSSA(self.mlir_math.absi(d), d.shape, d.dtype).to(self.cutlass.Float32)

    def tanh(self, x):
        return self.cute.math.tanh(x, fastmath=True)

    def gather(self, tensor, *indices):
        coords = []
        for index in indices:  # an SSA index (width 1) through a register fragment; a constant as it is
            if isinstance(index, int):
                coords.append(index)
                continue
            frag = self.cute.make_rmem_tensor(1, self.cutlass.Int32)
            frag.store(index)
            coords.append(frag[0])
        value = self.cute.make_rmem_tensor(1, tensor.element_type)
        value[0] = tensor[tuple(coords)] if len(coords) > 1 else tensor[coords[0]]
        return value.load().to(self.cutlass.Float32)


@lru_cache(maxsize=1)
def cute_dsl():
    """(CuteOps(), cute.jit), imported here: only a CUDA machine with nvidia-cutlass-dsl has them."""
    import cutlass.cute as cute
    return CuteOps(), cute.jit


def fa4_score_mods(softcap: float | None, alibi: bool, bias: str | None):
    """(score_mod, score_mod_bwd) for flash_attn_func's score_mod= / score_mod_bwd=, with the signatures of 4.0.0b36's
    call_score_mod / call_score_mod_bwd; built once per modifier set so FA4's compile cache (keyed on the callable's
    source and closure, utils.hash_callable) finds them again."""
    ops, jit = cute_dsl()
    return _score_mods(softcap, alibi, bias, ops, jit)


@lru_cache(maxsize=32)
def _score_mods(softcap, alibi, bias, ops, jit):
    def score_mod(score, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        return modified_scores(score, batch_idx, head_idx, q_idx, kv_idx, ops.offset(seqlen_info), aux_tensors,
                               ops=ops, softcap=softcap, alibi=alibi, bias=bias)

    def score_mod_bwd(grad, score, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        return score_grad(grad, score, ops=ops, softcap=softcap)

    return jit(score_mod), jit(score_mod_bwd)


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


@dataclass
class Fa4Plan(CallPlan):
    """The call's keywords on the device (CallPlan); `score_mod`: ALiBi / the bias as a score_mod."""

    score_mod: bool = False
    #: why a call with gradients raises BackwardUnsupported ('' = it has a backward)
    backward_refused: str = ""


@register
class FlashAttn4(FlashFamily):
    name = "flash-attn-4"
    colour, marker = "#637939", "<"
    library = "FlashAttention-4"
    #: vLLM FLASH_ATTN with version 4 (0.17.0 on; the default on sm100 where FA4 is there); SGLang fa4 (0.5.3 on,
    #: decode from 0.5.8); transformers flash_attention_4 (5.4.0 on)
    serving = (ServingKnob("vllm", "FLASH_ATTN", "0.17.0", also=("--attention-config.flash_attn_version=4",)),
               ServingKnob("sglang", "fa4", "0.5.3", decode_since="0.5.8"),
               ServingKnob("transformers", "flash_attention_4", "5.4.0"))
    #: with its dependencies (the CUTLASS DSL and its compiler for the torch's CUDA); offline: what pip resolves for
    #: flash-attn-4[cuN] (one compiler flavour: the DSL loads the newest installed one, cutlass/_mlir/_mlir_libs)
    install = Install("flash-attn-4==4.0.0b36", because="flash_attn.cute.interface of 4.0.0b36 is what its calls were "
                      "read against (score_mod signatures, no descale in flash_attn_func)",
                      gpu_machine_only="nothing on a CPU runs it and its CUTLASS DSL compiler is ~90 MiB a CUDA "
                      "flavour; its translation is tested with stand-ins",
                      cuda_extras={12: "", 13: "cu13"},
                      offline_wheels=("nvidia-cutlass-dsl-libs-cu{cuda}==4.8.1", "cuda-bindings=={cuda}.*",
                                      "apache-tvm-ffi==0.1.15.post2", "nvidia-cutlass-dsl-libs-base==4.8.1",
                                      "torch-c-dlpack-ext", "quack-kernels>=0.5.3", "flash-attn-4==4.0.0b36",
                                      "protobuf>=4.21.12", "nvidia-cutlass-dsl-libs-core==4.8.1", "cuda-pathfinder",
                                      "einops", "nvidia-cutlass-dsl==4.8.1"))
    package = "flash-attn-4"
    supports_backward = True
    #: softcap= and learnable_sink= natively; ALiBi and the bias through a score_mod (fa4_score_mods)
    modifiers = frozenset({"softcap", "sinks", "alibi", "bias"})
    supports_head_dim_v = True
    paged_kv = True
    mixed_batch = True

    def unavailable_reason(self, device):
        """FlashAttention-4 is flash_attn.cute.interface (flash-attn-4's namespace), not FA2's flash_attn_interface."""
        names = ", ".join(a["name"] for a in ARCHITECTURES.values())
        return cuda_import_problem(self.name, device, "flash_attn.cute.interface", "flash_attn.cute.interface",
                                   "pip install flash-attn-4 (needs nvidia-cutlass-dsl)", ARCHITECTURES.__contains__,
                                   f"flash-attn-4 here is read for {names}")

    def not_supported_reasons(self, case):
        reasons = super().not_supported_reasons(case)
        if case.fp8_kv is not None:
            reasons.append(FP8_REFUSAL)
        return reasons + (refusal(fa4_args, case) if case.page_size is None else [])

    def arch_reasons(self, case: AttentionCase, major: int) -> list[str]:
        """What architecture `major` (9, 10, 11) cannot take of `case`, from ARCHITECTURES."""
        arch = ARCHITECTURES[major]
        if arch["fits"](case.head_dim, case.head_dim_v):
            return []
        return [f"flash-attn-4 on {arch['name']} takes head dims {arch['head_dims']}; got ({case.head_dim}, "
                f"{case.head_dim_v})"]

    def arch_backward_reasons(self, case: AttentionCase, major: int) -> list[str]:
        """What architecture `major`'s backward cannot take of `case` (its forward can), from ARCHITECTURES."""
        arch, dims = ARCHITECTURES[major], (case.head_dim, case.head_dim_v)
        if case.modifiers and dims in arch["plain_backward_dims"]:
            return [f"flash-attn-4 on {arch['name']} runs head dims {dims}'s backward in its dedicated hd256 kernel, "
                    f"which takes no softcap, learnable_sink or score_mod; case has {case.modifier_id}"]
        return []

    def can_run(self, case, device, *, backward=False, dropout=False):
        reasons = super().can_run(case, device, backward=backward, dropout=dropout)
        major = _cuda_major(device)
        reasons += self.arch_reasons(case, major) if major in ARCHITECTURES else []
        return reasons + (self.case_backward_reasons(case, device) if backward else [])

    def case_backward_reasons(self, case: AttentionCase, device: torch.device) -> list[str]:
        """Why `case`'s backward cannot run here although its forward can (the bias's, arch_backward_reasons); the
        case's forward then runs and is judged alone."""
        reasons = [f"{self.name} has no bias backward: {BIAS_BACKWARD_REFUSAL}"] if case.bias is not None else []
        major = _cuda_major(device)
        return reasons + (self.arch_backward_reasons(case, major) if major in ARCHITECTURES else [])

    def modifier_path(self, case):
        native = [f"native {'learnable_sink' if m == 'sinks' else m}=" for m in ("softcap", "sinks")
                  if m in case.modifiers and not (m == "softcap" and (case.alibi or case.bias))]
        folded = [m for m in ("softcap", "alibi", "bias") if m in case.modifiers] if case.alibi or case.bias else []
        return " + ".join(native + ([f"score_mod ({', '.join(folded)}) + aux_tensors"] if folded else []))

    def mask_form(self, case, device):
        if case.page_size is not None:
            mixed = " + cu_seqlens_q" if case.mask.mixed else ""
            return MaskForm("native", 0, f"page_table + seqused_k, causal{mixed}")
        return MaskForm("native", 0, ", ".join(f"{k}={v}" for k, v in fa4_args(case).items()))

    def prepare(self, case, device, block_table=None) -> Fa4Plan:
        """The call's keywords on the device, once; with ALiBi or a bias, the score_mod pair built here."""
        if case.page_size is not None:
            # flash_attn_varlen_func's paged keywords: seqused_k (the cache lengths) and paged_call_args'
            lengths = torch.tensor(case.mask.lengths, dtype=torch.int32, device=device)
            return Fa4Plan(op=f"{self.name} (varlen, page_table)", kwargs={"seqused_k": lengths,
                                                                           **paged_call_args(case, device)}, paged=True)
        kwargs, score_mod = fa4_args(case), bool(case.alibi or case.bias)
        if score_mod:
            kwargs.update(zip(("score_mod", "score_mod_bwd"), fa4_score_mods(case.softcap, case.alibi, case.bias)))
        return Fa4Plan(op=self.name + (" (score_mod)" if score_mod else ""), kwargs=kwargs, score_mod=score_mod,
                       backward_refused="; ".join(self.case_backward_reasons(case, torch.device(device))))

    def forward(self, q, k, v, *, mask, scale, prepared: Fa4Plan | None = None, softcap=None, sinks=None,
                alibi_slopes=None, bias=None, block_table=None, cache_seqlens=None):
        from flash_attn.cute.interface import flash_attn_func, flash_attn_varlen_func
        plan = self.plan_for(prepared, q, k, v, mask=mask, scale=scale, softcap=softcap, sinks=sinks,
                             alibi_slopes=alibi_slopes, bias=bias, block_table=block_table)
        grads = [t for t in (q, k, v, sinks, bias) if t is not None and t.requires_grad]
        if plan.backward_refused and grads and torch.is_grad_enabled():
            raise BackwardUnsupported(plan.backward_refused)
        modifiers = {"softcap": softcap or 0.0, "learnable_sink": sinks}
        if plan.score_mod:  # the cap is inside the score_mod (FA4 asserts softcap and score_mod are not both given)
            # detached: the kernel gives aux tensors no gradient (the bias's backward is refused above), and torch's
            # DLPack export refuses a tensor that requires grad (4.0.0b36's to_cute_tensor detaches for the same reason)
            aux = [t.detach().contiguous() for t in (None if alibi_slopes is None else alibi_slopes.float(), bias)
                   if t is not None]
            modifiers = {"softcap": 0.0, "learnable_sink": sinks, "aux_tensors": aux}
        kwargs = dict(plan.kwargs)
        # None: every sequence seq_q queries, q as a batch (and every contiguous call); else q packed by cu_seqlens_q
        rows = kwargs.pop("rows", None)

        def call(x):
            out = (flash_attn_varlen_func(x, k, v, page_table=block_table, softmax_scale=scale, **kwargs, **modifiers)
                   if plan.paged else flash_attn_func(x, k, v, softmax_scale=scale, **kwargs, **modifiers))
            return out[0] if isinstance(out, tuple) else out

        return call(q) if rows is None else run_packed(q, rows, call)


def _cuda_major(device: torch.device) -> int | None:
    """The compute capability's major of a CUDA `device`, None off CUDA."""
    return torch.cuda.get_device_capability(device)[0] if device.type == "cuda" and torch.cuda.is_available() else None
