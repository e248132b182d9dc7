"""Attention modifiers (softcap, learnable sinks, ALiBi, additive bias): their semantics and formulas, written once.

With s = scale * q k^T (query i, key j, head h, batch b), in this order:

- softcap c:  s <- c * tanh(s / c)                        (Gemma 2/3; on the scaled scores, before anything else)
- ALiBi:      s <- s - slope_h * |i + seq_k - seq_q - j|  (FlashAttention-2's convention: bottom-right aligned,
              symmetric; slopes from `alibi_slopes(heads)`, the ALiBi paper's geometric sequence)
- bias:       s <- s + bias[b, h, i, j]                   ("head": one (heads, seq_q, seq_k) bias for every batch
              element; "full": (batch, heads, seq_q, seq_k)); an input with a gradient, dbias = dL/ds
- the mask:   s <- -inf where the mask hides key j
- sinks:      one logit sigma_h per query head, not scaled, in the softmax's denominator only:
              P_ij = exp(s_ij - m) / (sum_j exp(s_ij - m) + exp(sigma_h - m)),  m = max(max_j s_ij, sigma_h);
              a row that sees no key then has output 0 (the sink takes all the weight). An input with a gradient,
              dsigma_h = -sum_{b,i} P_sink,bhi * delta_bhi with delta = rowsum(dO * O).

Gradients through the cap: ds = ds' * (1 - (s'/c)^2). The value head dim (`head_dim_v`) may differ from the
query/key one (DeepSeek MLA: 192 / 128): v, out, d_out and dv have that last dim.
"""

from __future__ import annotations

import math

import torch

from harness.store.schema import GRADIENT_OF

#: the modifier names a case carries and a backend declares (Backend.modifiers)
MODIFIERS = ("softcap", "sinks", "alibi", "bias")
#: the bias kinds: "head" (heads, seq_q, seq_k) shared over the batch, "full" (batch, heads, seq_q, seq_k)
BIAS_KINDS = ("head", "full")
#: the gradient each input modifier adds to the judged quantities (schema.JUDGED_QUANTITIES)
MODIFIER_GRADS = {m: GRADIENT_OF[m] for m in MODIFIERS if m in GRADIENT_OF}
#: case-id tokens of the bias kinds
BIAS_TOKENS = {"head": "headbias", "full": "fullbias"}
#: softcap cases scale q so the scaled scores have this standard deviation in units of the cap: about 5 % of
#: them then exceed the cap (FlashAttention's tests scale q by the softcap for the same reason: with N(0,1)
#: inputs |s| << c and a backend that ignores the cap would pass)
SOFTCAP_SCORE_STD = 0.5
#: sinks are drawn around log(seq_k) + 0.5 (the log of a row's denominator for N(0,1) logits), with this spread,
#: so the sink takes a visible share of every row's weight; a sink near 0 could be scaled or dropped unseen
SINK_STD = 1.0


def validate_softcap(value: object) -> float | None:
    """None, or a finite float > 0 (a one-line ValueError otherwise)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"softcap={value!r}: must be a finite float > 0, or None")
    return float(value)


def validate_bias(value: object) -> str | None:
    if value is not None and value not in BIAS_KINDS:
        raise ValueError(f"bias={value!r}; allowed: None, {', '.join(map(repr, BIAS_KINDS))}")
    return value


def validate_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r}: must be True or False")
    return value


def alibi_slopes(heads: int) -> torch.Tensor:
    """The ALiBi paper's slopes for `heads` heads, (heads,) float32: 2^(-8(i+1)/n) for a power of two n; otherwise
    the slopes of the largest power of two p < heads, then every other slope of 2p heads for the rest
    (Press et al., "Train Short, Test Long", reference code get_slopes)."""
    if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
        raise ValueError(f"heads={heads!r}: must be an int >= 1")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    p = 2 ** int(math.floor(math.log2(heads)))
    slopes = power_of_two(p) if p == heads else power_of_two(p) + power_of_two(2 * p)[0::2][:heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


def softcap_scores(scores: torch.Tensor, cap: float) -> torch.Tensor:
    """c * tanh(s / c), elementwise (also inside a flex score_mod)."""
    return torch.tanh(scores / cap) * cap


def alibi_term(slope: torch.Tensor, q_idx: torch.Tensor, k_idx: torch.Tensor, seq_q: int, seq_k: int) -> torch.Tensor:
    """-slope * |i + seq_k - seq_q - j| on broadcastable tensors (also inside a flex score_mod)."""
    return -slope * (q_idx + (seq_k - seq_q) - k_idx).abs()


def alibi_bias(slopes: torch.Tensor, seq_q: int, seq_k: int, rows: tuple[int, int] | None = None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The dense ALiBi term (heads, rows, seq_k) in `dtype` on the slopes' device; rows=(start, stop) of the queries."""
    start, stop = rows if rows is not None else (0, seq_q)
    device = slopes.device
    q_idx = torch.arange(start, stop, device=device).view(1, -1, 1)
    k_idx = torch.arange(seq_k, device=device).view(1, 1, -1)
    return alibi_term(slopes.to(dtype).view(-1, 1, 1), q_idx, k_idx, seq_q, seq_k).to(dtype)


def bias_shape(kind: str, batch: int, heads: int, seq_q: int, seq_k: int) -> tuple[int, int, int, int]:
    """The canonical bias layout: (1 for "head" or batch for "full", heads, seq_q, seq_k)."""
    return (1 if kind == "head" else batch, heads, seq_q, seq_k)


def additive_term(mask, seq_q: int, seq_k: int, batch: int, dtype: torch.dtype, device,
                  slopes: torch.Tensor | None = None) -> torch.Tensor:
    """The score-independent part of the modifiers as one additive tensor (B|1, H|1, Sq, Sk) in `dtype`: the ALiBi
    term (heads, Sq, Sk) of `slopes` and the mask spec folded in as -inf. What a kernel that adds a float mask or
    bias to the scaled scores (SDPA's attn_mask, xformers' tensor attn_bias) is given; a bias input is added to
    it in the call, so its gradient reaches the input."""
    additive = torch.zeros(1, 1, seq_q, seq_k, dtype=dtype, device=device)
    if slopes is not None:
        additive = additive + alibi_bias(slopes.to(device), seq_q, seq_k).to(dtype).unsqueeze(0)
    if mask is not None:
        additive = additive.masked_fill(~mask.materialize(seq_q, seq_k, device, batch=batch), float("-inf"))
    return additive
