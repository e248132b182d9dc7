"""Attention modifiers (softcap, sinks, ALiBi, bias): their semantics written once (docs/variants.md, in order)."""

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
BIAS_TOKENS = {"head": "headbias", "full": "fullbias"}
#: softcap cases' score std in units of the cap: ~5 % of scores exceed it (with N(0,1) inputs |s| << c would pass)
SOFTCAP_SCORE_STD = 0.5
#: sinks' spread around log(seq_k) + 0.5, a row's log-denominator: a sink near 0 could be scaled or dropped unseen
SINK_STD = 1.0


def validate_softcap(value: object) -> float | None:
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


def validate_int(name: str, value: object, least: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"{name}={value!r}: must be an int >= {least}")
    return value


def alibi_slopes(heads: int) -> torch.Tensor:
    """The ALiBi paper's slopes, (heads,) float32 (Press et al., reference code get_slopes; docs/variants.md)."""
    validate_int("heads", heads)

    def power_of_two(n: int) -> list[float]:
        return [(2.0 ** (-8.0 / n)) ** (i + 1) for i in range(n)]

    p = 2 ** int(math.floor(math.log2(heads)))
    return torch.tensor(power_of_two(p) + power_of_two(2 * p)[0::2][:heads - p], dtype=torch.float32)


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
    q_idx = torch.arange(start, stop, device=slopes.device).view(1, -1, 1)
    k_idx = torch.arange(seq_k, device=slopes.device).view(1, 1, -1)
    return alibi_term(slopes.to(dtype).view(-1, 1, 1), q_idx, k_idx, seq_q, seq_k).to(dtype)


def additive_term(mask, seq_q: int, seq_k: int, batch: int, dtype: torch.dtype, device,
                  slopes: torch.Tensor | None = None) -> torch.Tensor:
    """The ALiBi term and the mask (as -inf) as one float mask (B|1, H|1, Sq, Sk) in `dtype` (SDPA, xformers)."""
    additive = torch.zeros(1, 1, seq_q, seq_k, dtype=dtype, device=device)
    if slopes is not None:
        additive = additive + alibi_bias(slopes.to(device), seq_q, seq_k).to(dtype).unsqueeze(0)
    if mask is not None:
        additive = additive.masked_fill(~mask.materialize(seq_q, seq_k, device, batch=batch), float("-inf"))
    return additive
