"""The physical limit a timed figure is held to: the peaks sampled at a run's start and end, and the margin."""

from __future__ import annotations

from typing import Iterable

import torch

from harness.measure.limits.bandwidth import (copy_bandwidth_per_thread_samples, copy_bandwidth_samples,
                                       streams_from_memory)
from harness.measure.limits.roofline import PEAK_SAMPLES, PER_THREAD, best_peaks, peak_samples
from harness.measure.stages import stage
from harness.cases.case import dtype_name
from harness.store.schema import REJECTED, Row

#: a timed figure above this multiple of the physical peak is rejected: room for a start peak depressed ~3x by load
PHYSICAL_MARGIN = 4.0
#: how a rejected row's timing reason starts when the physical limit rejected it (not the integrity checks)
BEYOND = "beyond the physical limit"
FP32 = dtype_name(torch.float32)
#: the key of the copy bandwidth's one-thread bound (GB/s) in the peaks a row is judged against
COPY_PER_THREAD = f"copy_gbps {PER_THREAD}"


def limit_tflops(peaks: dict[str, float], dtype: str) -> float | None:
    """TFLOP/s no kernel given `dtype` inputs beats: its and fp32's peaks and one-thread bounds; None."""
    keys = (dtype, FP32, f"{dtype} {PER_THREAD}", f"{FP32} {PER_THREAD}")
    return max((peaks[k] for k in keys if peaks.get(k)), default=None)


def beyond_physical_limit(dtype: str, tflops: float, gbps: float, nbytes: int, peaks: dict[str, float],
                          peak_gbps: float | None, device_type: str) -> str:
    """'' when a timed figure (TFLOP/s, GB/s of `nbytes`) is physically possible, else why its row is rejected."""
    limit = limit_tflops(peaks, dtype)
    if limit and tflops > PHYSICAL_MARGIN * limit:
        return (f"{BEYOND}: {tflops:.4g} TFLOP/s is {tflops / limit:.3g}x the {dtype} matmul peak {limit:.4g} "
                f"TFLOP/s (best of the run's samples; rejected above {PHYSICAL_MARGIN:g}x)")
    # the GB/s no streamed working set beats: the best of the measured copy and its one-thread bound
    peak_gbps = max((v for v in (peak_gbps, peaks.get(COPY_PER_THREAD)) if v), default=None)
    if peak_gbps and streams_from_memory(nbytes, device_type) and gbps > PHYSICAL_MARGIN * peak_gbps:
        return (f"{BEYOND}: {gbps:.4g} GB/s is {gbps / peak_gbps:.3g}x the copy bandwidth {peak_gbps:.4g} GB/s "
                f"(best of the run's samples; {nbytes} bytes stream from memory; rejected above {PHYSICAL_MARGIN:g}x)")
    return ""


def _floored(part: dict, threads: int) -> float:
    """The best copy bandwidth of one set of samples (start or end), at least one thread's."""
    return max(max(part["copy_gbps"]), max(part[COPY_PER_THREAD], default=0.0) / max(threads, 1))


class RunPeaks:
    """A run's peak samples: at its start, judging every row as built, and at its end, auditing them."""

    def __init__(self, device: torch.device, dtypes: Iterable[torch.dtype], samples: int = PEAK_SAMPLES):
        self.device, self.samples, self.threads = device, samples, torch.get_num_threads()
        self.dtypes = sorted(set(dtypes) | {torch.float32}, key=str)  # limit_tflops includes fp32
        self.start = self._sample()
        self.end: dict | None = None

    def _sample(self) -> dict:
        with stage("peaks"):  # its cost shows in the run's time_spent
            return {"matmul_tflops": peak_samples(self.device, self.dtypes, self.samples),
                    "copy_gbps": copy_bandwidth_samples(self.device, samples=self.samples),
                    COPY_PER_THREAD: copy_bandwidth_per_thread_samples(self.device, samples=self.samples)}

    @property
    def tflops(self) -> dict[str, float]:
        """{peak key: TFLOP/s}, the best of the start samples (roofline.best_peaks)."""
        return best_peaks(self.start["matmul_tflops"], self.threads)

    @property
    def gbps(self) -> float:
        """The best of the start's copy-bandwidth samples (GB/s), at least one thread's."""
        return _floored(self.start, self.threads)

    @property
    def judged(self) -> dict[str, float]:
        """What rows are judged against: tflops, and the copy bandwidth's one-thread bound where there is one."""
        bound = self.start[COPY_PER_THREAD]
        return {**self.tflops, **({COPY_PER_THREAD: max(bound)} if bound else {})}

    def measure_end(self) -> None:
        self.end = self._sample()

    def _all(self) -> tuple[dict[str, float], float]:
        """The best of the start and end samples together: (peaks as `judged` keys them, copy GB/s)."""
        parts = [self.start] + ([self.end] if self.end else [])
        merged: dict[str, list[float]] = {}
        for part in parts:  # an empty list (no one-thread bound) is no peak to best_peaks
            for key, values in [*part["matmul_tflops"].items(), (COPY_PER_THREAD, part[COPY_PER_THREAD])]:
                merged.setdefault(key, []).extend(values)
        return best_peaks(merged, self.threads), max(_floored(part, self.threads) for part in parts)

    def overturned(self, rows: Iterable[Row]) -> list[str]:
        """Keys of rows rejected for the physical limit that the best of all samples (start and end) lets through."""
        tflops, gbps = self._all()
        return ["/".join(row.key) for row in rows if row.timing_status == REJECTED
                and BEYOND in (row.timing_reason or "") and not beyond_physical_limit(
                    row.dtype, row.tflops or 0.0, row.gbps or 0.0, int(row.bytes_moved or 0), tflops, gbps,
                    self.device.type)]

    def record(self, rows: Iterable[Row] = ()) -> dict:
        """What env.json keeps: every sample, the margin, the start's best, and the end's audit."""
        out = {"margin": PHYSICAL_MARGIN, "judged_against": "the best of the start samples",
               "start": self.start, "end": self.end, "start_best": {**self.judged, "copy_gbps": self.gbps}}
        if self.end is not None:
            tflops, gbps = self._all()
            out.update(best={**tflops, "copy_gbps": gbps}, overturned_by_end_samples=self.overturned(rows))
        return out
