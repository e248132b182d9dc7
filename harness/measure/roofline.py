"""The roofline: the device's dense-matmul throughput per dtype, measured at the start of a run."""

from __future__ import annotations

import torch

from harness.measure.timing import Measurement, TimingConfig, measure
from harness.spec.case import dtype_name


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
