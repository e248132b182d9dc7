"""Peak memory of one call above what existed before it: the CUDA allocator's peak, or the CPU profiler's events."""

from __future__ import annotations

import itertools
from typing import Callable

import torch

from harness.backends.native_stderr import captured_stderr


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
    return cpu_peak(fn), "cpu-profiler-peak"


def cpu_peak(fn: Callable[[], object]) -> int:
    """Peak bytes allocated on the CPU during fn() above those live before it (fn's result is freed inside)."""
    # the CPU allocator keeps no statistics: the running sum of the profiler's allocation events is the live bytes
    from torch.profiler import ProfilerActivity, profile

    with captured_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
        del result
    events = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
              and e.device_type() == torch.autograd.DeviceType.CPU]
    return max(itertools.accumulate((nbytes for _, nbytes in sorted(events)), initial=0))  # the live bytes' peak
