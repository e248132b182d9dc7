"""Naive attention in the input dtype: the same-precision baseline a backend's tolerance is built from."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.oracle.reference import Reference
from harness.oracle.verdict import Check, judge
from harness.cases.case import AttentionCase, Inputs
from harness.cases.masks import MaskSpec
from harness.cases.modifiers import alibi_bias, alibi_slopes, softcap_scores
from harness.store.schema import GRADIENT_OF

#: score-sized tensors dense naive holds at once, forward and backward (scores, masked, probs, dP, dS, saved)
SCORE_TENSORS = 6


def naive_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
               scale: float, *, softcap: float | None = None, alibi: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Eager attention of some query rows, every op in the inputs' dtype. q (B, H, n, D); k (B, Hkv, Sk, D);
    v (B, Hkv, Sk, Dv); allowed (B|1, 1, n, Sk) bool or None; in harness.cases.modifiers' order softcap (float), alibi
    (H, n, Sk) these rows' ALiBi term, bias (B|1, H, n, Sk), sinks (H,) (a logit column with a zero value, as
    transformers' gpt-oss eager attention). A row that sees no key gives output 0 and gradient 0."""
    h, hkv = q.shape[1], k.shape[1]
    if hkv != h:  # GQA: query head i uses kv head i // (h // hkv)
        k = k.repeat_interleave(h // hkv, dim=1)
        v = v.repeat_interleave(h // hkv, dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale                    # (B, H, n, Sk), input dtype
    if softcap is not None:
        scores = softcap_scores(scores, softcap)
    if alibi is not None:
        scores = scores + alibi
    if bias is not None:
        scores = scores + bias
    if sinks is not None:  # a row always sees its sink: no empty-row special case
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        column = sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        return torch.softmax(torch.cat([scores, column], -1), dim=-1)[..., :-1] @ v
    if allowed is None:
        return torch.softmax(scores, dim=-1) @ v
    visible = allowed.any(-1, keepdim=True)
    # Rows with no visible key: fill with 0 instead of -inf so softmax and its gradient stay finite,
    # then zero them, matching the reference's "output 0, gradient 0".
    scores = scores.masked_fill(~allowed, float("-inf")).masked_fill(~visible, 0.0)
    probs = torch.softmax(scores, dim=-1).masked_fill(~visible, 0.0)
    return probs @ v


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: MaskSpec | None,
                    scale: float, *, softcap: float | None = None, alibi_slopes: torch.Tensor | None = None,
                    bias: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Eager attention with materialized scores in the inputs' dtype. q (B, H, Sq, D); k (B, Hkv, Sk, D);
    v (B, Hkv, Sk, Dv); the modifiers as Backend.forward takes them (alibi_slopes (H,) float32)."""
    sq, sk = q.shape[2], k.shape[2]
    allowed = None if mask is None else mask.materialize(sq, sk, q.device, batch=q.shape[0])
    alibi = None if alibi_slopes is None else alibi_bias(alibi_slopes, sq, sk).to(q.dtype)
    return naive_rows(q, k, v, allowed, scale, softcap=softcap, alibi=alibi, bias=bias, sinks=sinks)


def modifier_rows(case: AttentionCase, inputs: Inputs, rows: tuple[int, int], dtype: torch.dtype) -> dict:
    """naive_rows' modifier arguments for query rows `rows` of `case` in `dtype` (inputs.bias: the leaf to slice)."""
    return {"softcap": case.softcap,
            "alibi": alibi_bias(alibi_slopes(case.heads).to(inputs.q.device), case.seq_q, case.seq_k, rows)
            .to(dtype) if case.alibi else None,
            "bias": inputs.bias[:, :, slice(*rows)] if case.bias is not None else None,
            "sinks": inputs.sinks if case.sinks else None}


def dense_bytes(case: AttentionCase) -> int:
    """Bytes dense naive needs for its score matrices, forward and backward."""
    return SCORE_TENSORS * case.batch * case.heads * case.seq_q * case.seq_k * case.dtype.itemsize


def chunk_rows(case: AttentionCase, budget_bytes: int) -> int:
    """Query rows per chunk so one chunk's score matrices fit `budget_bytes` (all rows when dense fits)."""
    return max(1, min(case.seq_q, budget_bytes // (dense_bytes(case) // case.seq_q)))


@dataclass(frozen=True)
class Baseline:
    """Naive's checks against the reference (out and the case's gradients, at its fixed bound) and how it ran."""

    checks: dict[str, Check]
    method: str
    quantities: tuple[str, ...] = ("out", "dq", "dk", "dv")

    @property
    def usable(self) -> bool:
        return set(self.checks) == set(self.quantities) and all(c.passed for c in self.checks.values())


def baseline(case: AttentionCase, inputs: Inputs, reference: Reference, budget_bytes: int) -> Baseline:
    """Naive attention of `inputs` forward and backward (upstream inputs.d_out) in the case's dtype, judged against
    `reference`; dense within `budget_bytes`, else in query-row chunks. Errors (e.g. out of memory) propagate."""
    rows = chunk_rows(case, budget_bytes)
    out, grads = _chunked(case, inputs, rows)
    checks = {name: judge(name, t, reference.get(name), case.dtype, None, terms=reference.terms_of(name))
              for name, t in {"out": out, **grads}.items()}
    method = "dense" if rows >= case.seq_q else f"chunked ({rows} query rows a chunk)"
    return Baseline(checks, method, ("out",) + case.grads)


def _leaves(inputs: Inputs) -> dict[str, torch.Tensor]:
    return {name: getattr(inputs, name).detach().clone().requires_grad_(True) for name in GRADIENT_OF
            if getattr(inputs, name) is not None}


def _chunked(case: AttentionCase, inputs: Inputs, rows: int):
    q_all = inputs.q.detach()
    out = torch.empty(*q_all.shape[:-1], case.head_dim_v, dtype=q_all.dtype, device=q_all.device)
    dq = torch.empty_like(q_all)
    # every gradient but dq sums over query rows: accumulated in float32 (fp64: float64) from each chunk's result,
    # so the rounding model (one rounding per matmul in the dtype) is the dense one at any chunk size (one: dense)
    acc = torch.promote_types(case.dtype, torch.float32)
    sums = {GRADIENT_OF[n]: torch.zeros(t.shape, dtype=acc, device=t.device)
            for n, t in _leaves(inputs).items() if n != "q"}
    for start in range(0, case.seq_q, rows):
        stop = min(case.seq_q, start + rows)
        leaves = _leaves(inputs._replace(q=q_all[:, :, start:stop]))
        allowed = case.key_mask(q_all.device, rows=(start, stop))
        mods = modifier_rows(case, inputs._replace(**leaves), (start, stop), case.dtype)
        block = naive_rows(leaves["q"], leaves["k"], leaves["v"], allowed, case.scale, **mods)
        block.backward(inputs.d_out[:, :, start:stop])
        out[:, :, start:stop], dq[:, :, start:stop] = block.detach(), leaves["q"].grad
        for name, leaf in leaves.items():
            if name != "q":
                sums[GRADIENT_OF[name]] += leaf.grad.to(acc)
    return out, {"dq": dq, **{name: total.to(case.dtype) for name, total in sums.items()}}
