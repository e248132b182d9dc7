"""FP8 KV caches for a backend without an FP8 kernel: K and V dequantized with their scales inside the timed call (the
cost such a backend pays), into the queries' dtype, in whatever layout they arrive."""

from __future__ import annotations

import torch

from harness.spec.fp8 import dequantize

#: what the rows of a dequantizing backend say ran
DEQUANT_NOTE = "FP8 K/V dequantized inside the timed call"
#: the kv-head dim of K/V as a backend receives them: canonical (B, Hkv, S, D), bshd (B, S, Hkv, D), and a paged
#: cache (num_blocks, page_size, Hkv, D)
HEAD_AXIS = {"bhsd": 1, "bshd": 2, "paged": 2}


def dequantized_kv(k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
                   dtype: torch.dtype, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """k * k_scale and v * v_scale in `dtype`; scales (1,) or (kv_heads,) float32; `layout` a HEAD_AXIS key."""
    axis = HEAD_AXIS[layout]
    return dequantize(k, k_scale, dtype, axis), dequantize(v, v_scale, dtype, axis)
