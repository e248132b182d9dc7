"""The roofline: the device's dense-matmul throughput per dtype, sampled several times (at a run's start and end)."""

from __future__ import annotations

import contextlib
import time

import torch

from harness.measure.timing import Measurement, TimingConfig, measure
from harness.spec.case import dtype_name

#: each peak sample's timing: short, because a sample is repeated (PEAK_SAMPLES at the start of a run and again at
#: its end) and the best one is kept; the fastest repetition of each counts (measure's min). At least 2
#: repetitions, not 10: under heavy load one all-thread bf16 matmul here took 1.5 s, and ten of them made the
#: start's samples cost 47 s (2026-12-01, load average 11 on 2 cores)
SAMPLE_TIMING = TimingConfig(warmup_ms=50, budget_ms=150, min_reps=2)
#: samples of each peak at each end of a run: on this 2-core VM under other load one sample of the fp32 matmul
#: gave 0.0021 TFLOP/s and the next ones 0.062 to 0.19 (2026-12-01): the best of a few spaced ones is the peak
PEAK_SAMPLES = 3
#: seconds between samples, so a burst of other load does not depress all of them
SAMPLE_GAP_S = 0.05
#: a CPU sample whose first call takes longer than this (s) is that call alone: a quiet CPU's sample matmul takes
#: ~20 ms (cpu_size), and under load avg 12 on 2 cores one took 5 s, so repeating it cost the start 31 s
GIVE_UP_S = 0.2
#: the size of the one-thread matmul and of the all-thread probe of a CPU sample (see _one_sample): at 256 one
#: thread ran at its 1024^3 rate here (fp32 0.096 vs 0.1 TFLOP/s, bf16 0.37 vs 0.39) in ~0.3 ms, short enough to
#: run between preemptions under load average 15 on 2 cores, where its 512 and 1024 matmuls were depressed 10x
PROBE_N = 256
#: on a CPU, the key of one thread's rate times the threads (suffix of a dtype name): an upper bound of what all
#: threads can do (each core does at most what one does alone, single-core turbo included), and unlike the
#: all-thread rate it is not depressed by other load - a one-thread matmul's repetitions are short enough that
#: the fastest one ran uninterrupted, where all threads wait at every barrier for the one that was preempted
PER_THREAD = "1-thread x threads"


def matmul_peak_tflops(device: torch.device, dtype: torch.dtype,
                       config: TimingConfig = TimingConfig(warmup_ms=100, budget_ms=400),
                       n: int | None = None, give_up_s: float | None = None) -> tuple[float, Measurement]:
    """Achieved TFLOP/s of a large square (n x n, default by device) matmul in `dtype` on `device`: the roofline
    we hold attention to.

    Measured, not taken from a datasheet, because clocks, power limits and CPU thread counts decide it.
    The fastest repetition, not the median, defines it: a roofline is the best the device did, and on a
    shared machine the median is depressed by other load. give_up_s (CPU): when one call takes longer, that
    call's rate is the answer, not repeated (a loaded machine's sample: low, and best left to the other samples).
    """
    n = n or (8192 if device.type == "cuda" else cpu_size(dtype))
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    if give_up_s is not None and device.type == "cpu":
        start = time.perf_counter()
        a @ b
        once_ms = (time.perf_counter() - start) * 1e3
        if once_ms > give_up_s * 1e3:
            return 2 * n ** 3 / (once_ms * 1e-3) / 1e12, Measurement((once_ms,), "cpu-clock", torch.get_num_threads())
    m = measure(lambda: a @ b, device=device, config=config)
    return 2 * n ** 3 / (m.min * 1e-3) / 1e12, m


def cpu_size(dtype: torch.dtype, target_s: float = 0.02, looks: int = 3) -> int:
    """The matrix size whose matmul takes ~target_s here, between 256 and 1024: a CPU without bf16/fp16 units
    runs them at ~1 GFLOP/s, where a 1024^3 matmul (2 GFLOP) repeated ten times would cost a run 20 s. From the
    fastest of `looks` one-thread timings times the threads: one all-thread look under other load chose 256, where
    the rate is lowest (all threads stall at barriers for a preempted one; one thread alone does not)."""
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
def tf32_matmul(enabled: bool):
    """fp32 matmuls with TF32 tensor cores on or off for the duration, restored after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


@contextlib.contextmanager
def one_thread():
    """torch's intra-op threads set to 1 for the duration, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _one_sample(device: torch.device, d: torch.dtype, sizes: dict) -> dict[str, float]:
    """One sample of every peak of dtype `d`, keyed as measure_peaks keys them."""
    name = dtype_name(d)
    if device.type == "cuda":
        if d != torch.float32:
            return {name: matmul_peak_tflops(device, d, SAMPLE_TIMING)[0]}
        out = {}
        for mode, enabled in (("ieee", False), ("tf32", True)):
            with tf32_matmul(enabled):
                out[f"{name} {mode}"] = matmul_peak_tflops(device, d, SAMPLE_TIMING)[0]
        return {**out, name: max(out.values())}
    n = sizes.setdefault(d, cpu_size(d))
    threads = torch.get_num_threads()
    if threads == 1:
        return {name: matmul_peak_tflops(device, d, SAMPLE_TIMING, n=n, give_up_s=GIVE_UP_S)[0]}
    with one_thread():  # small: a call of ~0.3 ms runs between preemptions (a 1024^3 one, 10 ms, did not)
        alone = matmul_peak_tflops(device, d, SAMPLE_TIMING, n=PROBE_N)[0]
    # all threads together slower than a quarter of one alone: they stall at barriers for threads other load
    # preempted (an all-thread 1024^3 fp32 matmul took 7 s here, one thread 21 ms), so the sample is this small
    # probe's rate rather than seconds of a large matmul; the one-thread bound is the limit then
    probe = matmul_peak_tflops(device, d, SAMPLE_TIMING, n=PROBE_N, give_up_s=0.0)[0]
    together = probe if probe < alone / 4 else matmul_peak_tflops(device, d, SAMPLE_TIMING, n=n,
                                                                     give_up_s=GIVE_UP_S)[0]
    return {name: together, f"{name} {PER_THREAD}": threads * alone}


def peak_samples(device: torch.device, dtypes, samples: int = PEAK_SAMPLES) -> dict[str, list[float]]:
    """{peak key: TFLOP/s of each sample}, `samples` spaced samples of each dtype's matmul peak (dtypes taken in
    turn, so a burst of load hits one sample of each, not every sample of one). Keys: the dtype name; on a GPU
    also 'fp32 ieee' and 'fp32 tf32' (see measure_peaks); on a CPU with more than one thread also '<dtype>
    1-thread x threads' (PER_THREAD)."""
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
    """{peak key: the best of its samples}: a roofline is the best the device did. A dtype's peak with a one-thread
    bound (PER_THREAD, `threads` threads) is held between one thread's rate and the bound: all threads do at least
    what one does alone, and a best below that is a machine stalled by other load, not the device's peak."""
    best = {key: max(values) for key, values in samples.items() if values}
    for key, bound in list(best.items()):
        name = key.removesuffix(f" {PER_THREAD}")
        if name != key and name in best:
            best[name] = min(max(best[name], bound / threads), bound)
    return best


def measure_peaks(device: torch.device, dtypes, samples: int = PEAK_SAMPLES) -> dict[str, float]:
    """{dtype name: TFLOP/s} of the roofline, the best of `samples` spaced samples. fp32 on a GPU is the faster of
    a plain (SIMT) and a TF32 matmul: fused attention kernels may use TF32 (3xTF32) for fp32 inputs whatever the
    matmul flags say, and a roofline below what they can do would flag honest rows as suspicious. Both figures are
    kept ('fp32 ieee', 'fp32 tf32'), and on a multi-thread CPU the one-thread bound (PER_THREAD)."""
    return best_peaks(peak_samples(device, dtypes, samples), torch.get_num_threads())
