"""FP8 K/V (and q) dequantized inside the timed call, the cost a backend without an FP8 kernel pays."""

from __future__ import annotations

import torch

from harness.spec.fp8 import FP8_DTYPE, FP8_Q_DTYPE, dequantize, per_query_head


#: the heads' axis of q, K and V as a backend receives them: bhsd, bshd, a paged cache (num_blocks, page_size, Hkv, D)
HEAD_AXIS = {"bhsd": 1, "bshd": 2, "paged": 2}


def dequant_note(case) -> str:
    """What a dequantizing backend's row says it did for `case`: '' when nothing is FP8."""
    return "" if case.fp8_kv is None else f"FP8 {'Q/K/V' if case.fp8_q else 'K/V'} dequantized inside the timed call"


def dequantized_kv(k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
                   dtype: torch.dtype, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """k * k_scale and v * v_scale in `dtype`; scales (1,) or (kv_heads,) float32; `layout` a HEAD_AXIS key."""
    axis = HEAD_AXIS[layout]
    return dequantize(k, k_scale, dtype, axis), dequantize(v, v_scale, dtype, axis)


def dequantized_q(q: torch.Tensor, q_scale: torch.Tensor, layout: str) -> torch.Tensor:
    """q * q_scale in FP8_Q_DTYPE (an FP8 Q/K/V case's dtype); q_scale (1,) or (kv_heads,) per kv-head group, q's
    query heads on the `layout`'s head axis (a HEAD_AXIS key: the backend's layout)."""
    axis = HEAD_AXIS[layout]
    return dequantize(q, per_query_head(q_scale, q.shape[axis]), FP8_Q_DTYPE, axis)


def dequantized_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor,
                       v_scale: torch.Tensor, q_scale: torch.Tensor | None, layout: str,
                       kv_layout: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (when q_scale is given), k and v dequantized; k and v into q's dtype as dequantized (the case's);
    `kv_layout` (default `layout`): K/V's HEAD_AXIS key where it differs from q's (a paged cache)."""
    if q_scale is not None:
        q = dequantized_q(q, q_scale, layout)
    elif q.dtype == FP8_DTYPE:
        raise ValueError("q is float8 e4m3fn but no q_scale came with it: an FP8 Q/K/V call passes q_scale")
    k, v = dequantized_kv(k, v, k_scale, v_scale, q.dtype, kv_layout or layout)
    return q, k, v
