"""FP8 (e4m3fn) KV caches and queries: the scales, quantization and dequantization, defined once (docs/serving.md)."""

from __future__ import annotations

import torch

#: the case's `fp8_kv` values: one scale for the whole K (and one for V), or one per kv head
GRANULARITIES = ("tensor", "head")
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
#: standard deviations of a head's values that map to FP8_MAX
RANGE_STDS = 4.5
#: the dtype of an FP8 Q/K/V case (its output, and what a dequantizing backend computes in)
FP8_Q_DTYPE = torch.bfloat16
FORWARD_ONLY = "FP8 KV cases are forward-only: an inference cache takes no gradients"


def validate_fp8_kv(value: object) -> str | None:
    if value is not None and value not in GRANULARITIES:
        raise ValueError(f"fp8_kv={value!r}: allowed None (no FP8 cache) or one of {', '.join(GRANULARITIES)} "
                         "(a float8 e4m3 KV cache with a scale per tensor or per kv head)")
    return value


def magnitudes(kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(k, v) standard deviation per kv head, float32 (kv_heads,): k 1, 2, 4, 1, ...; v 0.5, 1.5, 3, 0.5, ..."""
    h = torch.arange(kv_heads) % 3
    return 2.0 ** h.float(), torch.tensor([0.5, 1.5, 3.0])[h]


def kv_scales(kv_heads: int, granularity: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_scale, v_scale) float32: shape (1,) per tensor, (kv_heads,) per head; x ~= x8 * scale."""
    k, v = (m * RANGE_STDS / FP8_MAX for m in magnitudes(kv_heads))
    return (k.max().view(1), v.max().view(1)) if granularity == "tensor" else (k, v)


def query_magnitudes(kv_heads: int) -> torch.Tensor:
    """q's standard deviation per kv-head group, float32 (kv_heads,): 1, 0.5, 0.25, 1, ... (against k's 1, 2, 4)."""
    return torch.tensor([1.0, 0.5, 0.25])[torch.arange(kv_heads) % 3]


def q_scales(kv_heads: int, granularity: str) -> torch.Tensor:
    """q_scale float32: (1,) per tensor, (kv_heads,) per kv-head group; q ~= q8 * scale of its head's group."""
    scale = query_magnitudes(kv_heads) * RANGE_STDS / FP8_MAX
    return scale.max().view(1) if granularity == "tensor" else scale


def per_query_head(scale: torch.Tensor, heads: int) -> torch.Tensor:
    """A per-group q scale (kv_heads,) as one per query head (heads,), grouped as GQA; a (1,) scale stays (1,)."""
    if scale.numel() == 1:
        return scale
    if heads % scale.numel():
        raise ValueError(f"q scale of {scale.numel()} groups does not divide heads={heads}")
    return scale.repeat_interleave(heads // scale.numel())


def _per_head(scale: torch.Tensor, ndim: int, head_axis: int) -> torch.Tensor:
    return scale.view([scale.numel() if i == head_axis else 1 for i in range(ndim)])


def quantize(x: torch.Tensor, scale: torch.Tensor, head_axis: int = 1) -> torch.Tensor:
    """x / scale saturated to +-448, as float8 e4m3fn; `head_axis`: x's kv-head dim (1 in (batch, kv_heads, seq, d))."""
    s = _per_head(scale.to(x.device, torch.float32), x.dim(), head_axis)
    return (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize(x8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, head_axis: int = 1) -> torch.Tensor:
    """x8 * scale in `dtype` (the product in float32, then one rounding to `dtype`; float64 stays exact)."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    return (x8.to(work) * _per_head(scale.to(x8.device, work), x8.dim(), head_axis)).to(dtype)


def dequantized_kv(case, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Canonical K and V of an FP8 case as its cache holds them, dequantized into `dtype` (float64: exact)."""
    return tuple(dequantize(quantize(x, s), s, dtype) for x, s in zip((k, v), kv_scales(case.kv_heads, case.fp8_kv)))


def dequantized_q(case, q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Canonical q of an FP8 Q/K/V case as quantized, dequantized into `dtype` (as dequantized_kv)."""
    scale = per_query_head(q_scales(case.kv_heads, case.fp8_kv), case.heads)
    return dequantize(quantize(q, scale), scale, dtype)
