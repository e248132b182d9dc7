"""FA2's documented visibility and score transform, written from its docstrings: the model its translations are
checked against (test-only)."""

import torch


def fa2_visible(seq_q: int, seq_k: int, *, causal: bool, window_size: tuple[int, int],
                key_lengths: tuple[int, ...] | None = None, cu_seqlens_q: tuple[int, ...] | None = None,
                cu_seqlens_k: tuple[int, ...] | None = None) -> torch.Tensor:
    """FA2's documented visibility, (B|1, 1, Sq, Sk) bool: query i sees keys in [i + Sk - Sq - left, i + Sk - Sq +
    right] (-1 = unbounded; causal means right = 0), and j < length; with cu_seqlens (varlen), the same inside each
    sequence [cu_q[s], cu_q[s+1]) x [cu_k[s], cu_k[s+1]) with its own lengths, nothing outside it."""
    if cu_seqlens_q is not None:
        ok = torch.zeros(seq_q, seq_k, dtype=torch.bool)
        spans = zip(cu_seqlens_q, cu_seqlens_q[1:], cu_seqlens_k, cu_seqlens_k[1:])
        for q0, q1, k0, k1 in spans:
            ok[q0:q1, k0:k1] = fa2_visible(q1 - q0, k1 - k0, causal=causal, window_size=window_size)[0, 0]
        return ok.view(1, 1, seq_q, seq_k)
    left, right = window_size[0], 0 if causal else window_size[1]
    i = torch.arange(seq_q).view(-1, 1)
    j = torch.arange(seq_k).view(1, -1)
    ok = torch.ones(seq_q, seq_k, dtype=torch.bool)
    if left >= 0:
        ok &= j >= i + seq_k - seq_q - left
    if right >= 0:
        ok &= j <= i + seq_k - seq_q + right
    ok = ok.view(1, 1, seq_q, seq_k)
    return ok if key_lengths is None else ok & (j.view(1, 1, 1, -1) < torch.tensor(key_lengths).view(-1, 1, 1, 1))


def fa2_documented_scores(scores: torch.Tensor, *, softcap: float, alibi_slopes: torch.Tensor | None) -> torch.Tensor:
    """FA2's documented score transform of scaled scores (B|1, H, Sq, Sk): tanh(s / softcap) * softcap when softcap
    > 0, then "-alibi_slope * |i + seqlen_k - seqlen_q - j|" added (flash_attn_interface.py), then the mask."""
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    if alibi_slopes is not None:
        sq, sk = scores.shape[-2:]
        distance = (torch.arange(sq).view(-1, 1) + sk - sq - torch.arange(sk).view(1, -1)).abs()   # |i + sk - sq - j|
        scores = scores - alibi_slopes.view(-1, 1, 1) * distance
    return scores
