"""pytest-benchmark carries the harness's own samples (its private `_make_stats` and `_mode`: pinned `<6`)."""

from __future__ import annotations

from typing import Iterable


def record_samples(benchmark, samples_ms: Iterable[float], *, group: str | None = None,
                   extra_info: dict | None = None) -> None:
    """Give the `benchmark` fixture our samples (ms) as its rounds, once per test; a no-op where it is disabled."""
    if group is not None:
        benchmark.group = group  # before _make_stats: the stats copy the group when they are made
    if extra_info:
        benchmark.extra_info.update(extra_info)
    if benchmark._mode:
        raise RuntimeError(f"the benchmark fixture was already used ({benchmark._mode})")
    benchmark._mode = "harness samples"  # marks the fixture used: no "fixture was not used" warning
    if benchmark.disabled:
        return
    stats = benchmark._make_stats(1)
    stats.options["timer"] = "harness (cuda events or perf_counter)"
    for sample in samples_ms:
        stats.update(float(sample) / 1e3)  # pytest-benchmark keeps seconds
