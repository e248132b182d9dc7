"""The oracle: float64 attention on CPU with hand-written gradients, chunked over query blocks.

Memory is O(block x seq_k) for the scores instead of O(seq_q x seq_k), so the reference handles
sequence lengths that no dense implementation can. A query row that sees no key is defined as
output 0 and gradient 0 (FlashAttention-2's and SDPA's convention since torch 2.5).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from harness.spec.case import AttentionCase, Inputs

# Score-block budget in elements (x 8 bytes in float64): ~64 MiB per temporary, about five live at once.
_BLOCK_ELEMENTS = 1 << 23


class Reference(NamedTuple):
    """float64 CPU tensors in the canonical layout: out/dq like q, dk/dv like k/v."""

    out: torch.Tensor
    dq: torch.Tensor | None
    dk: torch.Tensor | None
    dv: torch.Tensor | None

    def get(self, quantity: str) -> torch.Tensor | None:
        """The reference of one judged quantity: 'out', 'dq', 'dk' or 'dv'."""
        if quantity not in self._fields:
            raise ValueError(f"quantity={quantity!r}; allowed: {', '.join(self._fields)}")
        return getattr(self, quantity)


def default_block(case: AttentionCase) -> int:
    return max(1, _BLOCK_ELEMENTS // (case.batch * case.heads * case.seq_k))


def reference_attention(case: AttentionCase, inputs: Inputs, *, grads: bool = True,
                        block: int | None = None) -> Reference:
    """Exact attention of `inputs` for `case` in float64 on CPU; gradients use inputs.d_out as upstream."""
    block = block or default_block(case)
    if block < 1:
        raise ValueError(f"block={block}: must be >= 1")
    b, h, hkv, sq, sk, d = case.batch, case.heads, case.kv_heads, case.seq_q, case.seq_k, case.head_dim
    g = h // hkv
    cast = dict(dtype=torch.float64, device="cpu")
    # Query head h uses kv head h // g, so view queries as (B, Hkv, g, Sq, D) and broadcast K/V over g.
    q = inputs.q.to(**cast).reshape(b, hkv, g, sq, d)
    k = inputs.k.to(**cast).reshape(b, hkv, 1, sk, d)
    v = inputs.v.to(**cast).reshape(b, hkv, 1, sk, d)
    d_out = inputs.d_out.to(**cast).reshape(b, hkv, g, sq, d) if grads else None

    out = torch.empty_like(q)
    dq = torch.empty_like(q) if grads else None
    dk = torch.zeros(b, hkv, sk, d, **cast) if grads else None
    dv = torch.zeros(b, hkv, sk, d, **cast) if grads else None
    k_t = k.transpose(-1, -2)
    for start in range(0, sq, block):
        stop = min(sq, start + block)
        q_blk = q[..., start:stop, :]                                  # (B, Hkv, g, n, D)
        scores = (q_blk @ k_t) * case.scale                            # (B, Hkv, g, n, Sk)
        mask = case.key_mask("cpu", rows=(start, stop))
        if mask is not None:
            mask = mask.reshape(mask.shape[0], 1, 1, stop - start, sk)
            scores = scores.masked_fill(~mask, float("-inf"))
        row_max = scores.amax(-1, keepdim=True)
        visible = torch.isfinite(row_max)                              # False for rows with no key
        probs = torch.exp(scores - torch.where(visible, row_max, 0.0))
        probs = torch.where(visible, probs / probs.sum(-1, keepdim=True).clamp_min(1e-300), 0.0)
        o_blk = probs @ v
        out[..., start:stop, :] = o_blk
        if not grads:
            continue
        do_blk = d_out[..., start:stop, :]
        d_probs = do_blk @ v.transpose(-1, -2)
        delta = (do_blk * o_blk).sum(-1, keepdim=True)                # rowsum(dO * O) = rowsum(P * dP)
        d_scores = probs * (d_probs - delta) * case.scale
        dq[..., start:stop, :] = d_scores @ k
        dk += (d_scores.transpose(-1, -2) @ q_blk).sum(2)              # sum over the g query heads of a group
        dv += (probs.transpose(-1, -2) @ do_blk).sum(2)
    reshape_q = (b, h, sq, d)
    return Reference(out.reshape(reshape_q), dq.reshape(reshape_q) if grads else None, dk, dv)
