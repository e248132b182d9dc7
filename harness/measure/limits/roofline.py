"""The roofline: the device's dense-matmul throughput per dtype, sampled several times (at a run's start and end)."""

from __future__ import annotations

import contextlib
import time

import torch

from harness.measure.measurement import Measurement
from harness.measure.timing import TimingConfig, measure
from harness.cases.case import dtype_name

#: each peak sample's timing: short, the best sample is kept; 2 repetitions, not 10 (a loaded start took 47 s)
SAMPLE_TIMING = TimingConfig(warmup_ms=50, budget_ms=150, min_reps=2)
#: samples of each peak at each end of a run: under load one fp32 sample gave 0.0021 TFLOP/s, the next 0.062-0.19
PEAK_SAMPLES = 3
#: seconds between samples, so a burst of other load does not depress all of them
SAMPLE_GAP_S = 0.05
#: a CPU sample whose first call takes longer (s) is that call alone: ~20 ms when quiet, 5 s under load
GIVE_UP_S = 0.2
#: the one-thread matmul and all-thread probe of a CPU sample: its 1024^3 rate in ~0.3 ms, between preemptions
PROBE_N = 256
#: on a CPU, the key suffix of one thread's rate times the threads: a bound of all threads' that load does not depress
PER_THREAD = "1-thread x threads"


def matmul_peak_tflops(device: torch.device, dtype: torch.dtype, config: TimingConfig,
                       n: int | None = None, give_up_s: float | None = None) -> tuple[float, Measurement]:
    """(TFLOP/s of the fastest repetition, Measurement) of an n x n matmul in `dtype`."""
    n = n or (8192 if device.type == "cuda" else cpu_size(dtype))
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    if give_up_s is not None and device.type == "cpu":
        start = time.perf_counter()
        a @ b
        once_ms = (time.perf_counter() - start) * 1e3
        if once_ms > give_up_s * 1e3:
            return 2 * n ** 3 / (once_ms * 1e-3) / 1e12, Measurement((once_ms,), "cpu-clock", torch.get_num_threads())
    m = measure(lambda: a @ b, device=device, config=config)
    return 2 * n ** 3 / (m.min * 1e-3) / 1e12, m


def cpu_size(dtype: torch.dtype, target_s: float = 0.02, looks: int = 3) -> int:
    """The matrix size (256..1024) whose matmul takes ~target_s here, from one-thread timings."""
    a = torch.randn(256, 256).to(dtype)
    threads = torch.get_num_threads()
    best = float("inf")
    with one_thread():
        a @ a
        for _ in range(looks):
            start = time.perf_counter()
            a @ a
            best = min(best, time.perf_counter() - start)
    rate = threads * 2 * 256 ** 3 / max(best, 1e-9)
    return int(min(1024, max(256, round((rate * target_s / 2) ** (1 / 3) / 64) * 64)))


@contextlib.contextmanager
def _setting(get, put, value):
    """`put(value)` for the duration, `get()`'s value restored after."""
    before = get()
    put(value)
    try:
        yield
    finally:
        put(before)


def one_thread():
    """torch's intra-op threads set to 1 for the duration."""
    return _setting(torch.get_num_threads, torch.set_num_threads, 1)


def _one_sample(device: torch.device, d: torch.dtype, sizes: dict) -> dict[str, float]:
    """One sample of every peak of dtype `d`, keyed as best_peaks keys them."""
    name = dtype_name(d)
    if device.type == "cuda":
        if d != torch.float32:
            return {name: matmul_peak_tflops(device, d, SAMPLE_TIMING)[0]}
        out = {}
        for mode, precision in (("ieee", "highest"), ("tf32", "high")):  # fp32 matmuls without and with TF32
            with _setting(torch.get_float32_matmul_precision, torch.set_float32_matmul_precision, precision):
                out[f"{name} {mode}"] = matmul_peak_tflops(device, d, SAMPLE_TIMING)[0]
        return {**out, name: max(out.values())}
    n = sizes.setdefault(d, cpu_size(d))
    threads = torch.get_num_threads()
    if threads == 1:
        return {name: matmul_peak_tflops(device, d, SAMPLE_TIMING, n=n, give_up_s=GIVE_UP_S)[0]}
    with one_thread():  # small: a call of ~0.3 ms runs between preemptions
        alone = matmul_peak_tflops(device, d, SAMPLE_TIMING, n=PROBE_N)[0]
    # all threads slower than a quarter of one alone are stalled by load: the probe's rate, not seconds of a large one
    probe = matmul_peak_tflops(device, d, SAMPLE_TIMING, n=PROBE_N, give_up_s=0.0)[0]
    together = probe if probe < alone / 4 else matmul_peak_tflops(device, d, SAMPLE_TIMING, n=n,
                                                                     give_up_s=GIVE_UP_S)[0]
    return {name: together, f"{name} {PER_THREAD}": threads * alone}


def peak_samples(device: torch.device, dtypes, samples: int = PEAK_SAMPLES) -> dict[str, list[float]]:
    """{peak key: TFLOP/s of each sample}, dtypes taken in turn (a burst hits one sample of each)."""
    out: dict[str, list[float]] = {}
    sizes: dict = {}
    for i in range(samples):
        if i:
            time.sleep(SAMPLE_GAP_S)
        for d in dtypes:
            for key, value in _one_sample(device, d, sizes).items():
                out.setdefault(key, []).append(round(value, 6))
    return out


def best_peaks(samples: dict[str, list[float]], threads: int = 1) -> dict[str, float]:
    """{peak key: the best of its samples}, a dtype's held between one thread's rate and PER_THREAD's."""
    best = {key: max(values) for key, values in samples.items() if values}
    for key, bound in list(best.items()):
        name = key.removesuffix(f" {PER_THREAD}")
        if name != key and name in best:
            best[name] = min(max(best[name], bound / threads), bound)
    return best
