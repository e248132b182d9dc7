"""The roofline: the device's dense-matmul throughput per dtype, measured at the start of a run."""

from __future__ import annotations

import contextlib
import time

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
    n = 8192 if device.type == "cuda" else _cpu_size(dtype)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    m = measure(lambda: a @ b, device=device, config=config)
    return 2 * n ** 3 / (m.min * 1e-3) / 1e12, m


def _cpu_size(dtype: torch.dtype, target_s: float = 0.02) -> int:
    """The matrix size whose matmul takes ~target_s here, between 256 and 1024: a CPU without bf16/fp16 units
    runs them at ~1 GFLOP/s, where a 1024^3 matmul (2 GFLOP) repeated ten times would cost a run 20 s."""
    a = torch.randn(256, 256).to(dtype)
    a @ a
    start = time.perf_counter()
    a @ a
    rate = 2 * 256 ** 3 / max(time.perf_counter() - start, 1e-9)
    return int(min(1024, max(256, round((rate * target_s / 2) ** (1 / 3) / 64) * 64)))


@contextlib.contextmanager
def tf32_matmul(enabled: bool):
    """fp32 matmuls with TF32 tensor cores on or off for the duration, restored after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def measure_peaks(device: torch.device, dtypes) -> dict[str, float]:
    """{dtype name: TFLOP/s} of the roofline. fp32 on a GPU is the faster of a plain (SIMT) and a TF32 matmul:
    fused attention kernels may use TF32 (3xTF32) for fp32 inputs whatever the matmul flags say, and a roofline
    below what they can do would flag honest rows as suspicious. Both figures are kept ('fp32 ieee', 'fp32
    tf32')."""
    peaks: dict[str, float] = {}
    for d in dtypes:
        name = dtype_name(d)
        if d == torch.float32 and device.type == "cuda":
            for mode, enabled in (("ieee", False), ("tf32", True)):
                with tf32_matmul(enabled):
                    peaks[f"{name} {mode}"] = round(matmul_peak_tflops(device, d)[0], 6)
            peaks[name] = max(peaks[f"{name} ieee"], peaks[f"{name} tf32"])
        else:
            peaks[name] = round(matmul_peak_tflops(device, d)[0], 6)
    return peaks
