"""FP8 KV caches (vLLM's `--kv-cache-dtype fp8`): K and V stored as float8 e4m3fn with a float32 scale per tensor or
per kv head, x ~= x8 * scale. The scales, the quantization and the dequantization, defined once.

The scales depend on the case alone (not on the drawn values), so a call's keyword arguments can be built before
its inputs exist: make_inputs draws an FP8 case's K and V head h at magnitude K_MAGNITUDE(h) / V_MAGNITUDE(h) (heads
of different ranges are why per-head scales exist), and the scale maps RANGE_STDS standard deviations of that
magnitude to e4m3's largest finite value, 448 (rarer values saturate: the quantization's own error counts them).
k and v get different magnitudes, so a kernel using k's scale for v is wrong.
"""

from __future__ import annotations

import torch

#: the case's `fp8_kv` values: one scale for the whole K (and one for V), or one per kv head
GRANULARITIES = ("tensor", "head")
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
#: standard deviations of a head's values that map to FP8_MAX
RANGE_STDS = 4.5
FORWARD_ONLY = "FP8 KV cases are forward-only: an inference cache takes no gradients"


def validate_fp8_kv(value: object) -> str | None:
    if value is not None and value not in GRANULARITIES:
        raise ValueError(f"fp8_kv={value!r}: allowed None (no FP8 cache) or one of {', '.join(GRANULARITIES)} "
                         "(a float8 e4m3 KV cache with a scale per tensor or per kv head)")
    return value


def magnitudes(kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(k, v) standard deviation per kv head, float32 (kv_heads,): k 1, 2, 4, 1, ...; v 0.5, 1.5, 3, 0.5, ..."""
    h = torch.arange(kv_heads)
    k = 2.0 ** (h % 3).float()
    v = torch.tensor([0.5, 1.5, 3.0])[h % 3]
    return k, v


def kv_scales(kv_heads: int, granularity: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_scale, v_scale) float32: shape (1,) per tensor, (kv_heads,) per head; x ~= x8 * scale."""
    validate_fp8_kv(granularity)
    k, v = (m * RANGE_STDS / FP8_MAX for m in magnitudes(kv_heads))
    if granularity == "tensor":
        return k.max().view(1), v.max().view(1)
    return k, v


def _per_head(scale: torch.Tensor, ndim: int, head_axis: int) -> torch.Tensor:
    shape = [1] * ndim
    shape[head_axis] = scale.numel()
    return scale.view(shape)


def quantize(x: torch.Tensor, scale: torch.Tensor, head_axis: int = 1) -> torch.Tensor:
    """x / scale saturated to +-448, as float8 e4m3fn; `head_axis` is the kv-head dim of x (1 in the canonical
    (batch, kv_heads, seq, head_dim))."""
    s = _per_head(scale.to(x.device, torch.float32), x.dim(), head_axis)
    return (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize(x8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, head_axis: int = 1) -> torch.Tensor:
    """x8 * scale in `dtype` (the product in float32, then one rounding to `dtype`; float64 stays exact)."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    return (x8.to(work) * _per_head(scale.to(x8.device, work), x8.dim(), head_axis)).to(dtype)


def dequantized_kv(case, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Canonical K and V of an FP8 case as its cache holds them, dequantized into `dtype`: float64 for the reference
    (exact), the case's dtype for the same-precision baseline (what naive's call computes from)."""
    k_scale, v_scale = kv_scales(case.kv_heads, case.fp8_kv)
    return (dequantize(quantize(k, k_scale), k_scale, dtype), dequantize(quantize(v, v_scale), v_scale, dtype))
