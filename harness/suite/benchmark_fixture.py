"""pytest-benchmark carries the harness's own measurement: its table, JSON, --benchmark-autosave and
--benchmark-compare show statistics of the samples the harness timed, not of a second timing of its own.

pytest-benchmark has no public way to take external samples (ionelmc/pytest-benchmark#52); this uses the
fixture's `_make_stats` and the `_mode` guard, unchanged from 3.2 to 5.3 (hence the `<6` pin in pyproject.toml,
with its reason; tests/unit/suite/test_benchmark_fixture.py checks them against the installed version).
"""

from __future__ import annotations

from typing import Iterable


def record_samples(benchmark, samples_ms: Iterable[float], *, group: str | None = None,
                   extra_info: dict | None = None) -> None:
    """Give the `benchmark` fixture our samples (ms) as its rounds; nothing happens where it is disabled
    (--benchmark-disable, xdist). Call it once per test, after the correctness of what was timed is known."""
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
