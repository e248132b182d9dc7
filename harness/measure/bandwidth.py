"""The memory-bandwidth roofline: bytes an attention call must move, a device copy bandwidth sampled at the start
and end of a run, and whether a row is compute- or memory-bound (its arithmetic intensity against the ridge point)."""

from __future__ import annotations

import torch

from harness.measure.roofline import PEAK_SAMPLES
from harness.measure.timing import TimingConfig, measure
from harness.spec.case import AttentionCase
from harness.spec.masks import MaskSpec
from harness.store.schema import BWD, FWD, FWD_BWD, PHASES

#: bytes of the copied buffer: far above any L2 (50 MB on H100/H200) and the 2-core CPU's last-level cache, so the
#: copy streams from memory; a CPU copy of 64 MiB takes ~10-30 ms, cheap enough to run at every start
COPY_BYTES = {"cuda": 2 ** 30, "cpu": 64 * 2 ** 20}
#: the phases' minimal traffic in units of the forward's tensors: the backward reads Q, K, V, O, dO and writes
#: dQ, dK, dV (each tensor once), twice the forward's Q + K + V + O
PHASE_TRAFFIC = {FWD: 1, BWD: 2, FWD_BWD: 3}


def visible_keys(mask: MaskSpec | None, batch: int, seq_q: int, seq_k: int, block: int = 1024) -> int:
    """Keys that at least one query of a batch element sees, summed over the batch: each is read once per kv head.
    From the rows' key intervals where the mask has them (a difference array, O(seq_q + seq_k)), else from the
    materialized mask in row chunks."""
    if mask is None:
        return batch * seq_k
    ranges = mask.key_ranges(seq_q, seq_k, batch)
    if ranges is not None:
        lo, hi = (t.clamp(0, seq_k) for t in ranges)
        lo, hi = lo.where(hi > lo, 0), hi.where(hi > lo, 0)                   # empty rows cover nothing
        marks = torch.zeros(lo.shape[0], seq_k + 1, dtype=torch.int64)
        marks.scatter_add_(1, lo, torch.ones_like(lo)).scatter_add_(1, hi, -torch.ones_like(hi))
        covered = int((marks.cumsum(1)[:, :seq_k] > 0).sum())
        return covered * (batch if lo.shape[0] == 1 else 1)
    seen = None
    for start in range(0, seq_q, block):
        rows = mask.materialize(seq_q, seq_k, batch=batch, rows=(start, min(seq_q, start + block))).any(2)
        seen = rows if seen is None else seen | rows
    return int(seen.sum()) * (batch if seen.shape[0] == 1 else 1)


def bytes_moved(case: AttentionCase, phase: str = FWD) -> int:
    """The least traffic of one call in the case's dtype: Q + visible K + visible V + O, K and V counted once per kv
    head (GQA's query heads share them), each tensor read or written once (Q and O: the case's query tokens, without
    a mixed step's padding rows; K and V of an FP8 cache, and FP8 queries, at one byte an element); the backward twice
    that."""
    if phase not in PHASES:
        raise ValueError(f"phase={phase!r}; allowed: {', '.join(PHASES)}")
    size = case.dtype.itemsize
    q_size = 1 if case.fp8_q else size                                      # FP8 queries: one byte an element
    q_and_o = case.query_tokens * case.heads * case.head_dim * (q_size + size)  # a mixed step's padding rows: none
    kv_size = 1 if case.fp8_kv is not None else size                        # an FP8 cache: one byte an element
    k_and_v = 2 * visible_keys(case.mask, case.batch, case.seq_q, case.seq_k) * case.kv_heads * case.head_dim * kv_size
    return (q_and_o + k_and_v) * PHASE_TRAFFIC[phase]


def copy_bandwidth_gbps(device: torch.device, config: TimingConfig = TimingConfig(warmup_ms=20, budget_ms=200),
                        nbytes: int | None = None, samples: int = PEAK_SAMPLES) -> float:
    """Achieved GB/s (1e9 bytes, read + written) of a large device-to-device copy: the bandwidth ceiling; the best
    of `samples` (copy_bandwidth_samples).

    Measured, like the matmul peak, because the datasheet figure is not what a kernel gets; the fastest repetition
    defines it (a roofline is the best the device did); read and write both count, as FlashAttention's benchmark
    counts a kernel's traffic."""
    return max(copy_bandwidth_samples(device, config, nbytes, samples))


def copy_bandwidth_samples(device: torch.device, config: TimingConfig = TimingConfig(warmup_ms=20, budget_ms=200),
                           nbytes: int | None = None, samples: int = 1) -> list[float]:
    """GB/s of each of `samples` copies of `nbytes` (default COPY_BYTES), each the fastest of its repetitions."""
    nbytes = nbytes or COPY_BYTES["cuda" if device.type == "cuda" else "cpu"]
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    out = []
    for _ in range(samples):
        m = measure(lambda: dst.copy_(src), device=device, config=config)
        out.append(round(2 * src.numel() * 4 / (m.min * 1e-3) / 1e9, 3))
    return out


def copy_bandwidth_per_thread_samples(device: torch.device, samples: int = 1) -> list[float]:
    """On a multi-thread CPU, one thread's copy bandwidth times the threads, per sample: an upper bound of what all
    threads can move (bandwidth saturates, it never grows faster than the threads), which other load depresses
    far less than the all-thread copy (3.3 GB/s against 65 a minute before, on this 2-core VM under load
    average 12, 2026-12-01). Empty elsewhere."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads < 2:
        return []
    torch.set_num_threads(1)
    try:
        return [round(threads * g, 3) for g in copy_bandwidth_samples(device, samples=samples)]
    finally:
        torch.set_num_threads(threads)


def streams_from_memory(nbytes: int, device_type: str) -> bool:
    """Whether a call moving `nbytes` cannot be served from a cache faster than the copy bandwidth: at least the
    copy's own traffic (2 x COPY_BYTES: its source and destination), which the copy probe streamed at that rate.
    Smaller working sets may sit in a cache whose bandwidth nothing here measured (on a CPU, L1/L2 are many times
    DRAM's), so their GB/s is no physical limit."""
    return nbytes >= 2 * COPY_BYTES["cuda" if device_type == "cuda" else "cpu"]


def ridge_point(peak_tflops: float, peak_gbps: float) -> float:
    """FLOP per byte where the two ceilings meet: below it a kernel cannot reach the matmul peak."""
    return peak_tflops * 1e12 / (peak_gbps * 1e9)


def bound(flops: float, nbytes: float, peak_tflops: float | None, peak_gbps: float | None) -> str | None:
    """'memory' when the arithmetic intensity is below the ridge point, else 'compute'; None without both peaks."""
    if not peak_tflops or not peak_gbps or nbytes <= 0:
        return None
    return "memory" if flops / nbytes < ridge_point(peak_tflops, peak_gbps) else "compute"


def roofline_columns(case: AttentionCase, phase: str, flops: float, latency_ms: float, peak_tflops: float | None,
                     peak_gbps: float | None) -> dict:
    """The row's bandwidth columns and its roofline verdict: bytes_moved, gbps, pct_of_bw_peak, bound, and
    (suspicious, why) judged against the ceiling that binds it - a memory-bound row (decode) against the copy
    bandwidth, a compute-bound one against the matmul peak."""
    nbytes = bytes_moved(case, phase)
    gbps = nbytes / (latency_ms * 1e-3) / 1e9 if latency_ms > 0 else float("nan")
    tflops = flops / (latency_ms * 1e-3) / 1e12 if latency_ms > 0 else float("nan")
    pct_bw = 100.0 * gbps / peak_gbps if peak_gbps else float("nan")
    pct = 100.0 * tflops / peak_tflops if peak_tflops else float("nan")
    which = bound(flops, nbytes, peak_tflops, peak_gbps) or ("memory" if peak_gbps and not peak_tflops else "compute")
    why = ""
    if which == "memory" and pct_bw > 100:
        why = (f"suspicious: {gbps:.4g} GB/s exceeds the measured copy bandwidth {peak_gbps:.4g} GB/s (memory-bound "
               f"row; on a CPU a working set that fits the cache can do this)")
    elif which == "compute" and pct > 100:
        why = f"suspicious: {tflops:.3g} TFLOP/s exceeds the measured matmul peak {peak_tflops:.3g}"
    return {"bytes_moved": nbytes, "gbps": gbps, "pct_of_bw_peak": pct_bw,
            "bound": bound(flops, nbytes, peak_tflops, peak_gbps), "suspicious": bool(why), "why": why}
