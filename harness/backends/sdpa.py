"""PyTorch scaled_dot_product_attention: its own dispatch ('sdpa') and each kernel pinned with sdpa_kernel."""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness.backends.base import Backend, CallPlan, MaskForm, Unsupported
from harness.backends.native_stderr import captured_stderr
from harness.backends.fp8_dequant import dequant_note, dequantized_inputs
from harness.backends.paged_gather import gather_paged
from harness.backends.registry import register
from harness.cases.case import AttentionCase
from harness.cases.masks import CacheCausal, Causal, CausalBottomRight, MaskSpec
from harness.cases.modifiers import additive_term, alibi_slopes
from harness.backends.serving import ServingKnob

#: SDPA refusing a pinned kernel, and cuDNN failing to build a plan at run time: "this kernel cannot run this case"
_REFUSALS = ("No viable backend", "No available kernel")
_CUDNN_PLAN_ERRORS = ("cuDNN Frontend error", "No execution plans support the graph", "No valid execution plans",
                      "CUDNN_STATUS_", "mha_graph->execute")
#: SDPBackend value -> the short name recorded as the kernel that ran ('sdpa:cudnn', ...)
_KERNEL_NAMES = {SDPBackend.MATH: "math", SDPBackend.FLASH_ATTENTION: "flash",
                 SDPBackend.EFFICIENT_ATTENTION: "efficient", SDPBackend.CUDNN_ATTENTION: "cudnn"}


@dataclass
class SdpaPlan(CallPlan):
    """The call's keywords, and a mixed step's padding rows (batch, 1, seq_q, 1) bool, cleared after the call."""

    padding: torch.Tensor | None = None


def sdpa_mask_args(mask: MaskSpec | None, seq_q: int, seq_k: int, batch: int, device) -> dict:
    """Mask spec -> SDPA keyword arguments: is_causal=True for top-left causal (SDPA's alignment; bottom-right too
    when seq_q == seq_k), else a dense bool mask (True = attend), which the flash kernels refuse: SDPA's honest cost."""
    if mask is None:
        return {}
    if isinstance(mask, Causal) or (isinstance(mask, CausalBottomRight) and seq_q == seq_k):
        return {"is_causal": True}
    return {"attn_mask": mask.materialize(seq_q, seq_k, device, batch=batch)}


def sdpa_modifier_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, float_mask: torch.Tensor,
                         bias: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> tuple:
    """(k, v, attn_mask) carrying the bias and the sinks to SDPA: the bias added to the float mask; each sink one
    appended zero key and value whose mask column holds sigma_h (exactly the sink's term in the denominator);
    dsinks and dbias flow back through the mask. q (B, H, Sq, D); k, v (B, Hkv, Sk, D|Dv)."""
    attn_mask = float_mask if bias is None else float_mask + bias
    if sinks is None:
        return k, v, attn_mask
    b, h, sq, _ = q.shape
    k = torch.cat([k, k.new_zeros(b, k.shape[1], 1, k.shape[3])], dim=2)
    v = torch.cat([v, v.new_zeros(b, v.shape[1], 1, v.shape[3])], dim=2)
    rows = attn_mask.expand(attn_mask.shape[0], h, sq, attn_mask.shape[3])
    column = sinks.to(attn_mask.dtype).view(1, h, 1, 1).expand(rows.shape[0], h, sq, 1)
    return k, v, torch.cat([rows, column], dim=-1)


def _clean(text: str) -> str:
    """A torch warning without its source location, on one line."""
    return re.sub(r"\s+", " ", re.sub(r"\(Triggered internally at[^)]*\)", "", text)).strip()


class _Sdpa(Backend):
    library = "PyTorch SDPA"
    layout = "bhsd"
    native_probes = frozenset({"causal", "mask", "dropout"})
    #: ALiBi and bias as a float attn_mask with the mask folded in; sinks by the appended-key emulation
    modifiers = frozenset({"alibi", "bias", "sinks"})
    modifier_refusals = {"softcap": "SDPA has no softcap argument, and c*tanh(s/c) is not an additive attn_mask"}
    #: the math kernel takes any value head dim; a fused kernel that does not refuses with torch's reasons
    supports_head_dim_v = True
    paged_kv = True  # by gathering the pages through the block table, inside the timed call
    #: the dense attn_mask; padding rows see no key and are cleared after the call: the math kernel gives them 0
    #: (torch >= 2.5), but on an H200 (torch 2.11, cuDNN 9.19) sdpa's own choice, cuDNN, failed the mixed step that
    #: naive and flex passed with the same mask (tests/gpu/test_paged_cuda.py, 2026-12-04)
    mixed_batch = True
    fp8_kv = True  # by dequantizing K and V inside the timed call
    fp8_q = True  # and q
    kernel: SDPBackend | None = None
    cuda_only = False

    def unavailable_reason(self, device):
        if self.cuda_only and device.type != "cuda":
            return f"{self.name}: the {self.kernel.name} kernel is CUDA-only; device is {device.type}"
        return None

    def prepare(self, case: AttentionCase, device: torch.device) -> CallPlan:
        """The mask arguments on the device, and which kernel runs: SDPA's own choice (torch._fused_sdp_choice, which
        prefers cuDNN on sm90 with a recent cuDNN) or the pinned one, refused here with torch's reasons on CUDA."""
        if case.modifiers:  # the float mask's constant part; bias and sinks join it in the call (their grads)
            slopes = alibi_slopes(case.heads) if case.alibi else None
            float_mask = additive_term(case.mask, case.seq_q, case.seq_k, case.batch, case.dtype, device, slopes)
            kwargs = {"attn_mask": float_mask}
        else:
            kwargs = sdpa_mask_args(case.mask, case.seq_q, case.seq_k, case.batch, device)
        gqa = case.kv_heads != case.heads
        if self.kernel is None:
            choice = SDPBackend(torch._fused_sdp_choice(*_shaped(case, device), kwargs.get("attn_mask"), 0.0,
                                                        kwargs.get("is_causal", False), scale=case.scale,
                                                        enable_gqa=gqa))
            kernel = _KERNEL_NAMES.get(choice, choice.name.lower())
        else:
            if device.type == "cuda":  # torch's checks are compiled out on CPU: there the call says why it refuses
                _refused_why(self.kernel, *_shaped(case, device), kwargs, gqa)
            kernel = _KERNEL_NAMES[self.kernel]
        padding = case.mask.padding_rows(case.seq_q, device) if isinstance(case.mask, CacheCausal) and \
            case.mask.mixed else None
        return SdpaPlan(op=f"sdpa:{kernel}{dequant_note(case, gathers=True)}"
                           f"{' (padding rows cleared)' if padding is not None else ''}", kwargs=kwargs,
                        padding=None if padding is None else padding[:, None, :, None])

    def forward(self, q, k, v, *, mask, scale, prepared: CallPlan | None = None, sinks=None, alibi_slopes=None,
                bias=None, block_table=None, cache_seqlens=None, k_scale=None, v_scale=None, q_scale=None):
        if block_table is not None:  # paged: k, v are the caches; gather them, then attend as for any case
            k, v = gather_paged(k, v, block_table, cache_seqlens, mask, self.layout)
        if k_scale is not None:  # an FP8 cache (and q): dequantize (gathered first: the pages this call reads)
            q, k, v = dequantized_inputs(q, k, v, k_scale, v_scale, q_scale, self.layout)
        prepared = self.plan_for(prepared, q, k, v, mask=mask, scale=scale, sinks=sinks, alibi_slopes=alibi_slopes,
                                 bias=bias)
        if sinks is None and bias is None:
            out = self._call(q, k, v, scale=scale, **prepared.kwargs)
        else:
            k, v, attn_mask = sdpa_modifier_inputs(q, k, v, prepared.kwargs["attn_mask"], bias, sinks)
            out = self._call(q, k, v, scale=scale, attn_mask=attn_mask)
        # a fused kernel's answer on a row that sees no key (NaN, or the mean of V) is not the spec's 0
        return out if prepared.padding is None else out.masked_fill(prepared.padding, 0)

    def modifier_path(self, case):
        parts = [m for m in ("alibi", "bias") if m in case.modifiers]
        path = f"attn_mask float ({' + '.join(parts + ['mask' if case.mask is not None else ''])})".replace(" + )", ")")
        return path + (" + sink as an appended zero key/value" if case.sinks else "")

    def mask_form(self, case, device):
        args = sdpa_mask_args(case.mask, case.seq_q, case.seq_k, case.batch, device)
        if "attn_mask" in args:
            return MaskForm.dense(args["attn_mask"], "attn_mask")
        return MaskForm("native", 0, ", ".join(f"{k}={v}" for k, v in args.items()))

    def native_causal(self, q, k, v, *, scale):
        return self._call(q, k, v, scale=scale, is_causal=True)

    def native_mask(self, q, k, v, *, mask, scale):
        return self._call(q, k, v, scale=scale, attn_mask=mask)

    def native_dropout(self, q, k, v, *, p, scale):
        return self._call(q, k, v, scale=scale, dropout_p=p)

    def _call(self, q, k, v, *, scale, **kwargs):
        def call():
            return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=k.shape[1] != q.shape[1], **kwargs)

        if self.kernel is None:
            return _cudnn_refusals(call)
        if torch.compiler.is_compiling():  # under a user's torch.compile: no warnings capture (a graph break)
            with sdpa_kernel(self.kernel):
                return call()
        with warnings.catch_warnings(record=True) as caught, sdpa_kernel(self.kernel):
            warnings.simplefilter("always")  # the second identical refusal must be heard too
            try:
                return _cudnn_refusals(call)
            except RuntimeError as exc:
                if not any(m in str(exc) for m in _REFUSALS):
                    raise
                # torch explains why the pinned kernel refused in warnings; keep its words as the reason.
                why = "; ".join(_clean(str(w.message)) for w in caught) or str(exc)
                raise Unsupported(f"{self.kernel.name} refused: {why[:400]}") from None


def _shaped(case: AttentionCase, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Uninitialized q, k, v of the case's shapes: what torch's kernel checks look at (shapes, dtypes, strides)."""
    q = torch.empty(case.batch, case.heads, case.seq_q, case.head_dim, dtype=case.dtype, device=device)
    k = torch.empty(case.batch, case.kv_heads, case.seq_k, case.head_dim, dtype=case.dtype, device=device)
    return q, k, torch.empty_like(k)


def _refused_why(kernel: SDPBackend, q, k, v, kwargs: dict, gqa: bool) -> None:
    """Raise Unsupported with torch's reasons (can_use_*(debug=True): all of them on every call, where a refused call
    warns some only once) when the pinned CUDA kernel cannot take these inputs."""
    checks = {SDPBackend.FLASH_ATTENTION: torch.backends.cuda.can_use_flash_attention,
              SDPBackend.EFFICIENT_ATTENTION: torch.backends.cuda.can_use_efficient_attention,
              SDPBackend.CUDNN_ATTENTION: torch.backends.cuda.can_use_cudnn_attention}
    if kernel not in checks:
        return
    params = torch.backends.cuda.SDPAParams(q, k, v, kwargs.get("attn_mask"), 0.0, kwargs.get("is_causal", False), gqa)
    with warnings.catch_warnings(record=True) as caught, native_warnings() as native:
        warnings.simplefilter("always")
        ok = checks[kernel](params, True)
    if not ok:
        reasons = [_clean(str(w.message)) for w in caught] + native
        why = "; ".join(dict.fromkeys(reasons)) or "torch's checks refused these inputs"
        raise Unsupported(f"{kernel.name} refused: {why[:400]}")


#: a C++ TORCH_WARN line on stderr, e.g. (H200, torch 2.11): "[W1130 14:36:21.387796355 sdp_utils_cpp.h:262]
#: Warning: Flash Attention does not support non-null attn_mask. (function check_for_attn_mask)"
_NATIVE_WARNING = re.compile(r"Warning: (.*?)(?: \(function [\w:]+\))?\s*$")


@contextlib.contextmanager
def native_warnings():
    """Collect the C++ warnings torch writes to stderr meanwhile (the list fills when the block ends): torch's
    can_use_*_attention(params, debug=True) TORCH_WARN their reasons to fd 2, never to `warnings` (no Python handler
    in their bindings, torch/csrc/Module.cpp 2.11-2.13: on an H200 every refusal read "torch's checks refused these
    inputs")."""
    found: list[str] = []
    lines: list[str] = []
    try:
        with captured_stderr() as lines:
            yield found
    finally:  # also when the block raised: what was not a warning goes back to stderr
        for line in lines:
            match = _NATIVE_WARNING.search(line)
            if match:
                found.append(_clean(match.group(1)))
            elif line.strip():
                os.write(2, (line + "\n").encode())


def _cudnn_refusals(call):
    """Run `call`; a cuDNN plan that cannot be built for this shape is the kernel refusing it, not an error."""
    try:
        return call()
    except RuntimeError as exc:
        text = str(exc)
        if any(m in text for m in _CUDNN_PLAN_ERRORS):
            raise Unsupported(f"cuDNN refused: {_clean(text.splitlines()[0])[:400]}") from None
        raise


@register
class Sdpa(_Sdpa):
    name = "sdpa"
    #: transformers' default (modeling_utils.py `_check_and_adjust_attn_implementation` of 4.54.0-5.25.0, before it
    #: `_autoset_attn_implementation`); SGLang's torch_native (server_args.py choices since 0.4.6.post4); vLLM runs
    #: SDPA only in its CPU and vision-encoder paths, never as a decoder setting
    serving = (ServingKnob("transformers", "sdpa", "4.36.0", note="SDPA picks its kernel itself"),
               ServingKnob("sglang", "torch_native", "0.4.6.post4", note="no CUDA graphs"))
    colour, marker = "#1f77b4", "s"
    #: on the 2-core VM its CPU flash kernel ran at 0.11-0.51 of the GEMM rate (docs/measurements.md)
    relative_speed = {"cpu": 0.22}


@register
class SdpaMath(_Sdpa):
    name = "sdpa-math"
    colour, marker = "#17becf", "v"
    kernel = SDPBackend.MATH
    deterministic = "PyTorch: the math backend's backward is deterministic (composite of deterministic ops)"
    #: dense, as naive: on an H200 the same fwd+bwd took 54.7 ms (30 TFLOP/s); on the 2-core VM 0.024-0.11
    #: (docs/measurements.md)
    relative_speed = {"cpu": 0.055, "cuda": 0.043}


@register
class SdpaFlash(_Sdpa):
    name = "sdpa-flash"
    colour, marker = "#d62728", "^"
    kernel = SDPBackend.FLASH_ATTENTION
    #: on the 2-core VM 0.09-0.46 of the GEMM rate (docs/measurements.md)
    relative_speed = {"cpu": 0.18}


@register
class SdpaEfficient(_Sdpa):
    name = "sdpa-efficient"
    colour, marker = "#2ca02c", "D"
    kernel = SDPBackend.EFFICIENT_ATTENTION
    cuda_only = True


@register
class SdpaCudnn(_Sdpa):
    name = "sdpa-cudnn"
    colour, marker = "#9467bd", "P"
    kernel = SDPBackend.CUDNN_ATTENTION
    cuda_only = True
    dtypes = (torch.float16, torch.bfloat16)
