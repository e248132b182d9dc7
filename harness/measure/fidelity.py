"""Timing fidelity: one kernel timed by the harness and by an independent timer in the same run; the ratio is recorded."""

from __future__ import annotations

from typing import Callable

import torch

from harness.measure.timing import Measurement, TimingConfig, measure


def independent_median_ms(fn: Callable[[], object], device: torch.device, budget_s: float = 0.5) -> tuple[float, str]:
    """Median latency (ms) from a timer the harness does not own: triton's do_bench on GPU, torch's Timer on CPU."""
    if device.type == "cuda":
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=25, rep=int(budget_s * 1e3), return_mode="median")), "triton.do_bench"
    from torch.utils.benchmark import Timer
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=budget_s).median * 1e3, "torch.utils.benchmark.Timer"


def fidelity(fn: Callable[[], object], device: torch.device,
             config: TimingConfig = TimingConfig(warmup_ms=100, budget_ms=500)) -> dict:
    """{harness_ms, independent_ms, ratio, independent} for `fn` on `device` (ratio = harness / independent)."""
    ours: Measurement = measure(fn, device=device, config=config)
    theirs, name = independent_median_ms(fn, device)
    return {"harness_ms": ours.median, "independent_ms": theirs, "ratio": ours.median / theirs,
            "independent": name, "harness_mode": ours.mode, "n_samples": ours.n}
