"""Naive attention in the input dtype: the same-precision baseline a backend's tolerance is built from."""

from __future__ import annotations

import torch

from harness.spec.masks import MaskSpec


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: MaskSpec | None,
                    scale: float) -> torch.Tensor:
    """Eager attention with materialized scores, every op in the inputs' dtype. q (B, H, Sq, D); k, v (B, Hkv, Sk, D).

    A query row that sees no key gives output 0 and gradient 0, like the reference.
    """
    b, h, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    if hkv != h:  # GQA: query head i uses kv head i // (h // hkv)
        k = k.repeat_interleave(h // hkv, dim=1)
        v = v.repeat_interleave(h // hkv, dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale                    # (B, H, Sq, Sk), input dtype
    if mask is None:
        return torch.softmax(scores, dim=-1) @ v
    allowed = mask.materialize(sq, sk, q.device, batch=b)        # (B|1, 1, Sq, Sk)
    visible = allowed.any(-1, keepdim=True)
    # Rows with no visible key: fill with 0 instead of -inf so softmax and its gradient stay finite,
    # then zero them, matching the reference's "output 0, gradient 0".
    scores = scores.masked_fill(~allowed, float("-inf")).masked_fill(~visible, 0.0)
    probs = torch.softmax(scores, dim=-1).masked_fill(~visible, 0.0)
    return probs @ v
