"""FP8 KV caches (vLLM's `--kv-cache-dtype fp8`): K and V stored as float8 e4m3fn with a float32 scale per tensor or
per kv head, x ~= x8 * scale. The scales, the quantization and the dequantization, defined once.

The scales depend on the case alone (not on the drawn values), so a call's keyword arguments can be built before
its inputs exist: make_inputs draws an FP8 case's K and V head h at magnitude K_MAGNITUDE(h) / V_MAGNITUDE(h) (heads
of different ranges are why per-head scales exist), and the scale maps RANGE_STDS standard deviations of that
magnitude to e4m3's largest finite value, 448 (rarer values saturate: the quantization's own error counts them).
k and v get different magnitudes, so a kernel using k's scale for v is wrong.

FP8 queries too (the case's `fp8_q`, FlashAttention-3's FP8 path): q e4m3 with a scale per tensor or per kv-head
group (the query heads that share a kv head share a scale: FA3's q_descale is (batch, num_heads_k)), following the
case's granularity; make_inputs draws q's group g at Q_MAGNITUDE(g) (query_magnitudes). An FP8 Q/K/V case outputs
bfloat16 (FA3's FP8 kernels do; FP8_Q_DTYPE), the dtype every backend dequantizes into.
"""

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


def query_magnitudes(kv_heads: int) -> torch.Tensor:
    """q's standard deviation per kv-head group, float32 (kv_heads,): 1, 0.5, 0.25, 1, ... (k's are 1, 2, 4: the
    scores keep one range while the groups' scales differ, so a kernel reading one group's scale for all is wrong)."""
    return torch.tensor([1.0, 0.5, 0.25])[torch.arange(kv_heads) % 3]


def q_scales(kv_heads: int, granularity: str) -> torch.Tensor:
    """q_scale float32: (1,) per tensor, (kv_heads,) per kv-head group; q ~= q8 * scale of its head's group."""
    validate_fp8_kv(granularity)
    scale = query_magnitudes(kv_heads) * RANGE_STDS / FP8_MAX
    return scale.max().view(1) if granularity == "tensor" else scale


def per_query_head(scale: torch.Tensor, heads: int) -> torch.Tensor:
    """A q scale (1,) or per kv-head group (kv_heads,) as one per query head (heads,) (group g: heads g*G..g*G+G-1,
    G = heads // kv_heads, as GQA groups them); a per-tensor scale stays (1,)."""
    if scale.numel() == 1:
        return scale
    if heads % scale.numel():
        raise ValueError(f"q scale of {scale.numel()} groups does not divide heads={heads}")
    return scale.repeat_interleave(heads // scale.numel())


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


def dequantized_q(case, q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Canonical q of an FP8 Q/K/V case as quantized, dequantized into `dtype` (as dequantized_kv)."""
    scale = per_query_head(q_scales(case.kv_heads, case.fp8_kv), case.heads)
    return dequantize(quantize(q, scale), scale, dtype)
