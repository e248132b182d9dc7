"""Naive attention in the input dtype: the same-precision baseline a backend's tolerance is built from.

Dense when its score matrices fit a memory budget; otherwise in query-row chunks. A row's output does not depend
on the other rows, so the forward error of each row is what dense naive gives; dK/dV are sums over query rows,
accumulated here in float32 from each chunk's same-precision matmul, so the gradients keep the same rounding
model (one rounding per matmul in the dtype) at any chunk size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.oracle.reference import Reference
from harness.oracle.verdict import Check, judge
from harness.spec.case import AttentionCase, Inputs
from harness.spec.masks import MaskSpec

#: score-sized tensors dense naive holds at once, forward and backward (scores, masked, probs, dP, dS, saved)
SCORE_TENSORS = 6


def naive_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
               scale: float) -> torch.Tensor:
    """Eager attention of some query rows, every op in the inputs' dtype. q (B, H, n, D); k, v (B, Hkv, Sk, D);
    allowed (B|1, 1, n, Sk) bool or None. A row that sees no key gives output 0 and gradient 0, like the reference."""
    h, hkv = q.shape[1], k.shape[1]
    if hkv != h:  # GQA: query head i uses kv head i // (h // hkv)
        k = k.repeat_interleave(h // hkv, dim=1)
        v = v.repeat_interleave(h // hkv, dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale                    # (B, H, n, Sk), input dtype
    if allowed is None:
        return torch.softmax(scores, dim=-1) @ v
    visible = allowed.any(-1, keepdim=True)
    # Rows with no visible key: fill with 0 instead of -inf so softmax and its gradient stay finite,
    # then zero them, matching the reference's "output 0, gradient 0".
    scores = scores.masked_fill(~allowed, float("-inf")).masked_fill(~visible, 0.0)
    probs = torch.softmax(scores, dim=-1).masked_fill(~visible, 0.0)
    return probs @ v


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: MaskSpec | None,
                    scale: float) -> torch.Tensor:
    """Eager attention with materialized scores in the inputs' dtype. q (B, H, Sq, D); k, v (B, Hkv, Sk, D)."""
    allowed = None if mask is None else mask.materialize(q.shape[2], k.shape[2], q.device, batch=q.shape[0])
    return naive_rows(q, k, v, allowed, scale)


def dense_bytes(case: AttentionCase) -> int:
    """Bytes dense naive needs for its score matrices, forward and backward."""
    return SCORE_TENSORS * case.batch * case.heads * case.seq_q * case.seq_k * case.dtype.itemsize


def chunk_rows(case: AttentionCase, budget_bytes: int) -> int:
    """Query rows per chunk so one chunk's score matrices fit `budget_bytes` (all rows when dense fits)."""
    per_row = SCORE_TENSORS * case.batch * case.heads * case.seq_k * case.dtype.itemsize
    return max(1, min(case.seq_q, budget_bytes // per_row))


@dataclass(frozen=True)
class Baseline:
    """Naive's checks against the reference (out, dq, dk, dv; naive is held to its fixed bound) and how it ran."""

    checks: dict[str, Check]
    method: str

    @property
    def usable(self) -> bool:
        return set(self.checks) == {"out", "dq", "dk", "dv"} and all(c.passed for c in self.checks.values())


def baseline(case: AttentionCase, inputs: Inputs, reference: Reference, budget_bytes: int) -> Baseline:
    """Naive attention of `inputs` forward and backward (upstream gradient inputs.d_out) in the case's dtype, judged
    against `reference`; dense within `budget_bytes`, else in query-row chunks. Raises what the computation raises
    (e.g. out of memory): the caller turns that into its note."""
    rows = chunk_rows(case, budget_bytes)
    out, grads = (_dense if rows >= case.seq_q else _chunked)(case, inputs, rows)
    checks = {"out": judge("out", out, reference.out, case.dtype, None)}
    for name, grad in grads.items():
        checks[name] = judge(name, grad, reference.get(name), case.dtype, None)
    method = "dense" if rows >= case.seq_q else f"chunked ({rows} query rows a chunk)"
    return Baseline(checks, method)


def _leaves(inputs: Inputs) -> tuple[torch.Tensor, ...]:
    return tuple(t.detach().clone().requires_grad_(True) for t in inputs[:3])


def _dense(case: AttentionCase, inputs: Inputs, rows: int):
    q, k, v = _leaves(inputs)
    out = naive_attention(q, k, v, case.mask, case.scale)
    out.backward(inputs.d_out)
    return out.detach(), {"dq": q.grad, "dk": k.grad, "dv": v.grad}


def _chunked(case: AttentionCase, inputs: Inputs, rows: int):
    q_all, k_all, v_all = (t.detach() for t in inputs[:3])
    out = torch.empty_like(q_all)
    dq = torch.empty_like(q_all)
    dk = torch.zeros(k_all.shape, dtype=torch.float32, device=k_all.device)
    dv = torch.zeros(v_all.shape, dtype=torch.float32, device=v_all.device)
    for start in range(0, case.seq_q, rows):
        stop = min(case.seq_q, start + rows)
        q = q_all[:, :, start:stop].clone().requires_grad_(True)
        k, v = k_all.clone().requires_grad_(True), v_all.clone().requires_grad_(True)
        allowed = case.key_mask(q.device, rows=(start, stop))
        block = naive_rows(q, k, v, allowed, case.scale)
        block.backward(inputs.d_out[:, :, start:stop])
        out[:, :, start:stop], dq[:, :, start:stop] = block.detach(), q.grad
        dk += k.grad.float()          # each chunk's dK/dV is one same-precision matmul, summed in float32
        dv += v.grad.float()
    return out, {"dq": dq, "dk": dk.to(k_all.dtype), "dv": dv.to(v_all.dtype)}
