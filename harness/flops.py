"""FLOP counts from the exact number of attended pairs, and the device's dense-matmul peak measured at run start."""

from __future__ import annotations

import torch

from harness.case import AttentionCase, dtype_name
from harness.masks import count_attended_pairs
from harness.timing import Measurement, TimingConfig, measure

#: backward does 2.5x the forward's matmul work (dS, dP, dQ, dK, dV against S and O in the forward)
BACKWARD_FACTOR = 2.5
PHASE_FACTOR = {"fwd": 1.0, "bwd": BACKWARD_FACTOR, "fwd+bwd": 1.0 + BACKWARD_FACTOR}


def attention_flops(case: AttentionCase, phase: str) -> int:
    """2*pairs*D_qk (QK^T) + 2*pairs*D_v (PV), pairs = attended (query, key) pairs over batch and heads."""
    if phase not in PHASE_FACTOR:
        raise ValueError(f"phase={phase!r}; allowed: {', '.join(PHASE_FACTOR)}")
    pairs = count_attended_pairs(case.mask, case.batch, case.seq_q, case.seq_k) * case.heads
    forward = 2 * pairs * case.head_dim + 2 * pairs * case.head_dim
    return int(forward * PHASE_FACTOR[phase])


def matmul_peak_tflops(device: torch.device, dtype: torch.dtype,
                       config: TimingConfig = TimingConfig(warmup_ms=100, budget_ms=400)) -> tuple[float, Measurement]:
    """Achieved TFLOP/s of a large square matmul in `dtype` on `device`: the roofline we hold attention to.

    Measured, not taken from a datasheet, because clocks, power limits and CPU thread counts decide it.
    The fastest repetition, not the median, defines it: a roofline is the best the device did, and on a
    shared machine the median is depressed by other load.
    """
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    m = measure(lambda: a @ b, device=device, config=config)
    return 2 * n ** 3 / (m.min * 1e-3) / 1e12, m


def measure_peaks(device: torch.device, dtypes) -> dict[str, float]:
    return {dtype_name(d): round(matmul_peak_tflops(device, d)[0], 6) for d in dtypes}
