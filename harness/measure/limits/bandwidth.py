"""The memory-bandwidth roofline: bytes a call must move, the device copy bandwidth, compute- or memory-bound."""

from __future__ import annotations

import torch

from harness.measure.limits.roofline import one_thread
from harness.measure.timing import TimingConfig, measure
from harness.cases.case import AttentionCase, dtype_name
from harness.cases.masks import MaskSpec
from harness.store.schema import BWD, FWD, FWD_BWD

#: bytes of the copied buffer: far above any L2 (50 MB on H100/H200) and a CPU's last-level cache, so it streams
COPY_BYTES = {"cuda": 2 ** 30, "cpu": 64 * 2 ** 20}
#: minimal traffic in forward units: the backward reads Q, K, V, O, dO and writes dQ, dK, dV, twice the forward's
PHASE_TRAFFIC = {FWD: 1, BWD: 2, FWD_BWD: 3}


def visible_keys(mask: MaskSpec | None, batch: int, seq_q: int, seq_k: int, block: int = 1024) -> int:
    """Keys that at least one query of a batch element sees, summed over the batch."""
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
    """Least bytes one call moves: Q, O and the visible K, V once per kv head (FP8: 1 byte); backward twice."""
    size = case.dtype.itemsize
    q_size = 1 if case.fp8_q else size                                      # FP8 queries: one byte an element
    q_and_o = case.query_tokens * case.heads * case.head_dim * (q_size + size)  # a mixed step's padding rows: none
    kv_size = 1 if case.fp8_kv is not None else size                        # an FP8 cache: one byte an element
    k_and_v = 2 * visible_keys(case.mask, case.batch, case.seq_q, case.seq_k) * case.kv_heads * case.head_dim * kv_size
    return (q_and_o + k_and_v) * PHASE_TRAFFIC[phase]


def copy_bandwidth_samples(device: torch.device, config: TimingConfig = TimingConfig(warmup_ms=20, budget_ms=200),
                           nbytes: int | None = None, samples: int = 1) -> list[float]:
    """GB/s (1e9 bytes, read + written) of each of `samples` copies of `nbytes` (default COPY_BYTES), each the
    fastest of its repetitions: the best is the ceiling."""
    nbytes = nbytes or COPY_BYTES["cuda" if device.type == "cuda" else "cpu"]
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return [round(2 * src.numel() * 4 / (measure(lambda: dst.copy_(src), device=device, config=config).min * 1e-3)
                  / 1e9, 3) for _ in range(samples)]


def copy_bandwidth_per_thread_samples(device: torch.device, samples: int = 1) -> list[float]:
    """On a multi-thread CPU, one thread's copy GB/s times the threads, per sample."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads < 2:
        return []
    with one_thread():
        return [round(threads * g, 3) for g in copy_bandwidth_samples(device, samples=samples)]


def streams_from_memory(nbytes: int, device_type: str) -> bool:
    """Whether a call moving `nbytes` cannot be served from a cache: the copy probe's own traffic."""
    return nbytes >= 2 * COPY_BYTES["cuda" if device_type == "cuda" else "cpu"]


def bound(flops: float, nbytes: float, peak_tflops: float | None, peak_gbps: float | None) -> str | None:
    """'memory' below the ridge point (FLOP per byte where the ceilings meet), else 'compute'; None without."""
    if not peak_tflops or not peak_gbps or nbytes <= 0:
        return None
    return "memory" if flops / nbytes < peak_tflops * 1e12 / (peak_gbps * 1e9) else "compute"


def roofline_columns(case: AttentionCase, phase: str, flops: float, latency_ms: float, peak_tflops: float | None,
                     peak_gbps: float | None) -> dict:
    """tflops, pct_of_peak, bytes_moved, gbps, pct_of_bw_peak, bound, and (suspicious, why) against the binding
    ceiling."""
    nbytes = bytes_moved(case, phase)
    gbps = nbytes / (latency_ms * 1e-3) / 1e9 if latency_ms > 0 else float("nan")
    tflops = flops / (latency_ms * 1e-3) / 1e12 if latency_ms > 0 else float("nan")
    pct_bw = 100.0 * gbps / peak_gbps if peak_gbps else float("nan")
    pct = 100.0 * tflops / peak_tflops if peak_tflops else float("nan")
    binds = bound(flops, nbytes, peak_tflops, peak_gbps)
    which = binds or ("memory" if peak_gbps and not peak_tflops else "compute")
    why = ""
    if which == "memory" and pct_bw > 100:
        why = (f"suspicious: {gbps:.4g} GB/s exceeds the measured copy bandwidth {peak_gbps:.4g} GB/s (memory-bound "
               f"row; on a CPU a working set that fits the cache can do this)")
    elif which == "compute" and pct > 100:
        why = (f"suspicious: {tflops:.3g} TFLOP/s exceeds the measured {dtype_name(case.dtype)} matmul peak "
               f"{peak_tflops:.3g}")
    return {"tflops": tflops, "pct_of_peak": pct, "bytes_moved": nbytes, "gbps": gbps, "pct_of_bw_peak": pct_bw,
            "bound": binds, "suspicious": bool(why), "why": why}
