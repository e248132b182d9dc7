"""Deliberately wrong attention kernels: the verdict must report each of them as 'fail'.

Also a working example of the plugin API (`--backend-module tests/broken_backends.py`).
"""

from __future__ import annotations

import torch

from harness import Backend, register
from harness.masks import CausalBottomRight


def _expand_kv(q, k, v):
    g = q.shape[1] // k.shape[1]
    return k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)


def _attend(q, k, v, mask, scale, *, after_softmax=False):
    k, v = _expand_kv(q, k, v)
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if mask is not None and not after_softmax:
        allowed = mask.materialize(q.shape[2], k.shape[2], q.device, batch=q.shape[0])
        s = s.masked_fill(~allowed, float("-inf")).nan_to_num(neginf=-1e30)
    p = torch.softmax(s, -1)
    if mask is not None and after_softmax:
        p = p * mask.materialize(q.shape[2], k.shape[2], q.device, batch=q.shape[0])
    return (p @ v.float()).to(q.dtype)


@register
class WrongScaleHeadDim(Backend):
    """Scales by 1/head_dim instead of 1/sqrt(head_dim)."""

    name = "broken-scale"

    def forward(self, q, k, v, *, mask, scale):
        return _attend(q, k, v, mask, scale * scale)


@register
class MaskAfterSoftmax(Backend):
    """Applies the mask to the probabilities instead of the scores (rows no longer sum to 1)."""

    name = "broken-mask-after-softmax"

    def forward(self, q, k, v, *, mask, scale):
        return _attend(q, k, v, mask, scale, after_softmax=True)


@register
class ReshapeWithoutTranspose(Backend):
    """Takes (B, S, H, D) memory and reshapes it to (B, H, S, D) without transposing: heads are scrambled."""

    name = "broken-reshape"
    layout = "bshd"

    def forward(self, q, k, v, *, mask, scale):
        b, sq, h, d = q.shape
        sk, hkv = k.shape[1], k.shape[2]
        out = _attend(q.reshape(b, h, sq, d), k.reshape(b, hkv, sk, d), v.reshape(b, hkv, sk, d), mask, scale)
        return out.transpose(1, 2)


@register
class CausalOffByOne(Backend):
    """Causal that hides the diagonal too (j < i instead of j <= i)."""

    name = "broken-causal-diagonal"

    def forward(self, q, k, v, *, mask, scale):
        k, v = _expand_kv(q, k, v)
        s = (q.float() @ k.float().transpose(-1, -2)) * scale
        if mask is not None:
            allowed = mask.materialize(q.shape[2], k.shape[2], q.device, batch=q.shape[0])
            allowed = allowed & ~torch.eye(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
            s = s.masked_fill(~allowed, -1e30)
        return (torch.softmax(s, -1) @ v.float()).to(q.dtype)


@register
class CausalAlignedWrongCorner(Backend):
    """Implements every causal mask bottom-right, as FA2 does: wrong for top-left causal when seq_q != seq_k."""

    name = "broken-causal-alignment"

    def forward(self, q, k, v, *, mask, scale):
        return _attend(q, k, v, CausalBottomRight() if mask is not None else None, scale)


@register
class GqaWrongGroup(Backend):
    """Maps query head h to kv head h % kv_heads (interleaved) instead of h // group."""

    name = "broken-gqa-mapping"

    def forward(self, q, k, v, *, mask, scale):
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1)
        return _attend(q, k, v, mask, scale)


@register
class LowPrecisionAccumulation(Backend):
    """Computes everything in bfloat16, softmax included, whatever the input dtype: fine for bf16, wrong for fp32."""

    name = "broken-bf16-everywhere"

    def forward(self, q, k, v, *, mask, scale):
        k, v = _expand_kv(q, k, v)
        qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
        s = (qb @ kb.transpose(-1, -2)) * scale
        if mask is not None:
            allowed = mask.materialize(q.shape[2], k.shape[2], q.device, batch=q.shape[0])
            s = s.masked_fill(~allowed, -1e30)
        return (torch.softmax(s, -1) @ vb).to(q.dtype)


@register
class DropsLastKey(Backend):
    """Ignores the last key (a classic tail-tile bug)."""

    name = "broken-drops-last-key"

    def forward(self, q, k, v, *, mask, scale):
        sk = k.shape[2]
        if sk == 1:
            return torch.zeros_like(q)
        sub = None
        if mask is not None:
            sub = mask.materialize(q.shape[2], sk, q.device, batch=q.shape[0])[..., : sk - 1]
        k, v = k[:, :, : sk - 1], v[:, :, : sk - 1]
        kk, vv = _expand_kv(q, k, v)
        s = (q.float() @ kk.float().transpose(-1, -2)) * scale
        if sub is not None:
            s = s.masked_fill(~sub, -1e30)
        return (torch.softmax(s, -1) @ vv.float()).to(q.dtype)


@register
class NoisyOutput(Backend):
    """Correct attention plus a relative error of 2% on the output: small, but far above any dtype's rounding."""

    name = "broken-noise-2pct"

    def forward(self, q, k, v, *, mask, scale):
        out = _attend(q, k, v, mask, scale)
        return out * 1.02


class _ScaledQueryGrad(torch.autograd.Function):
    """Identity on q in the forward; multiplies dq by 1.05 in the backward."""

    @staticmethod
    def forward(ctx, q):
        return q.view_as(q)

    @staticmethod
    def backward(ctx, grad):
        return grad * 1.05


@register
class WrongQueryGradient(Backend):
    """Correct forward, dq 5% too large: only the gradient check can see it."""

    name = "broken-dq"

    def forward(self, q, k, v, *, mask, scale):
        return _attend(_ScaledQueryGrad.apply(q), k, v, mask, scale)


BROKEN = ["broken-scale", "broken-mask-after-softmax", "broken-reshape", "broken-causal-diagonal",
          "broken-causal-alignment", "broken-gqa-mapping", "broken-bf16-everywhere", "broken-drops-last-key",
          "broken-noise-2pct", "broken-dq"]
