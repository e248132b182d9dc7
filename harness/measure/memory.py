"""Peak memory of one call above what existed before it: the CUDA allocator's peak, or the CPU profiler's events."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable

import torch


def peak_memory(fn: Callable[[], object], *, device: torch.device,
                setup: Callable[[], None] | None = None) -> tuple[int, str]:
    """(peak bytes allocated during fn() above the bytes live before it, method name)."""
    if setup:
        setup()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        result = fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        del result
        return int(peak), "cuda-allocator-peak"
    return _cpu_peak(fn), "cpu-profiler-peak"


@contextlib.contextmanager
def _quiet_native_stderr():
    """Silence what C++ code writes to file descriptor 2 meanwhile (kineto prints a line per profiler start and
    stop), so the terminal shows only the harness's own output."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _cpu_peak(fn) -> int:
    # The CPU allocator keeps no statistics; the profiler records every allocation and free with its
    # size and time, so the running sum of those events, in time order, is the live-bytes curve.
    from torch.profiler import ProfilerActivity, profile

    with _quiet_native_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
        del result
    events = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
              and e.device_type() == torch.autograd.DeviceType.CPU]
    live = peak = 0
    for _, nbytes in sorted(events):
        live += nbytes
        peak = max(peak, live)
    return peak
