"""PyTorch scaled_dot_product_attention: its own dispatch ('sdpa') and each kernel pinned with sdpa_kernel."""

from __future__ import annotations

import re
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness.backends.base import Backend, MaskForm, Unsupported
from harness.backends.registry import register
from harness.spec.masks import Causal, CausalBottomRight, MaskSpec


def sdpa_mask_args(mask: MaskSpec | None, seq_q: int, seq_k: int, batch: int, device) -> dict:
    """Mask spec -> SDPA keyword arguments.

    Top-left causal maps to is_causal=True (SDPA's documented top-left alignment); bottom-right causal is
    the same thing when seq_q == seq_k. Everything else becomes a dense bool mask (True = attend), which
    the flash kernels on GPU refuse: that cost is the honest one for SDPA.
    """
    if mask is None:
        return {}
    if isinstance(mask, Causal) or (isinstance(mask, CausalBottomRight) and seq_q == seq_k):
        return {"is_causal": True}
    return {"attn_mask": mask.materialize(seq_q, seq_k, device, batch=batch)}


class _Sdpa(Backend):
    layout = "bhsd"
    native_probes = frozenset({"causal", "mask", "dropout"})
    kernel: SDPBackend | None = None
    cuda_only = False

    def unavailable_reason(self, device):
        if self.cuda_only and device.type != "cuda":
            return f"{self.name}: the {self.kernel.name} kernel is CUDA-only; device is {device.type}"
        return None

    def forward(self, q, k, v, *, mask, scale):
        return self._call(q, k, v, scale=scale, **sdpa_mask_args(mask, q.shape[2], k.shape[2], q.shape[0], q.device))

    def mask_form(self, case, device):
        args = sdpa_mask_args(case.mask, case.seq_q, case.seq_k, case.batch, device)
        if "attn_mask" in args:
            return MaskForm.dense(args["attn_mask"], "attn_mask")
        return MaskForm("native", 0, ", ".join(f"{k}={v}" for k, v in args.items()))

    # Native probes (harness/probes/semantics.py, dropout.py): SDPA's own arguments, no mask spec involved,
    # so the semantics suites observe what SDPA itself does with them.
    def native_causal(self, q, k, v, *, scale):
        return self._call(q, k, v, scale=scale, is_causal=True)

    def native_mask(self, q, k, v, *, mask, scale):
        return self._call(q, k, v, scale=scale, attn_mask=mask)

    def native_dropout(self, q, k, v, *, p, scale):
        return self._call(q, k, v, scale=scale, dropout_p=p)

    def _call(self, q, k, v, *, scale, **kwargs):
        gqa = k.shape[1] != q.shape[1]
        if self.kernel is None:
            return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa, **kwargs)
        if torch.compiler.is_compiling():  # under a user's torch.compile: no warnings capture (a graph break)
            with sdpa_kernel(self.kernel):
                return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa, **kwargs)
        with warnings.catch_warnings(record=True) as caught, sdpa_kernel(self.kernel):
            warnings.simplefilter("always")
            try:
                return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa, **kwargs)
            except RuntimeError as exc:
                if "No viable backend" not in str(exc) and "No available kernel" not in str(exc):
                    raise
                # torch explains why the pinned kernel refused in warnings; keep its words as the reason.
                why = "; ".join(re.sub(r"\s+", " ", re.sub(r"\(Triggered internally at[^)]*\)", "", str(w.message))).strip()
                                for w in caught) or str(exc)
                raise Unsupported(f"{self.kernel.name} refused: {why[:400]}") from None


@register
class Sdpa(_Sdpa):
    name = "sdpa"


@register
class SdpaMath(_Sdpa):
    name = "sdpa-math"
    kernel = SDPBackend.MATH
    deterministic = "PyTorch: the math backend's backward is deterministic (composite of deterministic ops)"


@register
class SdpaFlash(_Sdpa):
    name = "sdpa-flash"
    kernel = SDPBackend.FLASH_ATTENTION


@register
class SdpaEfficient(_Sdpa):
    name = "sdpa-efficient"
    kernel = SDPBackend.EFFICIENT_ATTENTION
    cuda_only = True


@register
class SdpaCudnn(_Sdpa):
    name = "sdpa-cudnn"
    kernel = SDPBackend.CUDNN_ATTENTION
    cuda_only = True
    dtypes = (torch.float16, torch.bfloat16)
