"""FP8 K/V (and q) dequantized inside the timed call, the cost a backend without an FP8 kernel pays."""

from __future__ import annotations

import torch

from harness.backends.paged_gather import GATHER_NOTE
from harness.cases.fp8 import FP8_DTYPE, FP8_Q_DTYPE, dequantize, per_query_head


#: the heads' axis of q, K and V as a backend receives them: bhsd, bshd, a paged cache (num_blocks, page_size, Hkv, D)
HEAD_AXIS = {"bhsd": 1, "bshd": 2, "paged": 2}


def dequant_note(case, gathers: bool = False) -> str:
    """What a dequantizing backend's op says it did for `case`, as ' (...)' suffixes: the gather of a paged case when
    it `gathers`, the FP8 dequantization; '' when neither."""
    notes = [GATHER_NOTE if gathers and case.page_size is not None else "",
             "" if case.fp8_kv is None else f"FP8 {'Q/K/V' if case.fp8_q else 'K/V'} dequantized inside the timed call"]
    return "".join(f" ({n})" for n in notes if n)


def dequantized_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor,
                       v_scale: torch.Tensor, q_scale: torch.Tensor | None, layout: str,
                       kv_layout: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (when q_scale is given), k and v dequantized; k and v into q's dtype as dequantized (the case's);
    `kv_layout` (default `layout`): K/V's HEAD_AXIS key where it differs from q's (a paged cache). Scales (1,) or
    (kv_heads,) float32; q's per kv-head group, q dequantized to FP8_Q_DTYPE (an FP8 Q/K/V case's dtype)."""
    if q_scale is not None:
        axis = HEAD_AXIS[layout]
        q = dequantize(q, per_query_head(q_scale, q.shape[axis]), FP8_Q_DTYPE, axis)
    elif q.dtype == FP8_DTYPE:
        raise ValueError("q is float8 e4m3fn but no q_scale came with it: an FP8 Q/K/V call passes q_scale")
    axis = HEAD_AXIS[kv_layout or layout]
    return q, dequantize(k, k_scale, q.dtype, axis), dequantize(v, v_scale, q.dtype, axis)
