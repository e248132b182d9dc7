"""record_samples against the installed pytest-benchmark's real fixture: the private names it uses (`_mode`,
`_make_stats`; the reason for the `<6` pin in pyproject.toml) still do what it needs, on every install."""

import time
from types import SimpleNamespace

import pytest

from harness.suite.benchmark_fixture import record_samples

fixture = pytest.importorskip("pytest_benchmark.fixture")


def _real_fixture(added: list, disabled: bool = False):
    """pytest-benchmark 5.3.1's BenchmarkFixture, built with the arguments its plugin passes (plugin.py
    `benchmark` fixture), for a test node named `test_x`."""
    return fixture.BenchmarkFixture(
        SimpleNamespace(name="test_x", nodeid="t.py::test_x"), disable_gc=False,
        timer=SimpleNamespace(target=time.perf_counter), min_rounds=1, min_time=0.0, max_time=1.0, precision=None,
        confidence=None, warmup=False, warmup_iterations=0, calibration_precision=10, add_stats=added.append,
        logger=None, warner=None, disabled=disabled, cprofile=False, cprofile_loops=None, cprofile_dump=None)


def test_the_samples_become_the_fixtures_rounds_in_seconds():
    added = []
    bench = _real_fixture(added)
    record_samples(bench, [2.0, 1.0, 3.0], group="g", extra_info={"case": "c"})
    (meta,) = added
    assert meta.stats.rounds == 3 and meta.stats.median == pytest.approx(2e-3) and meta.stats.min == pytest.approx(1e-3)
    assert meta.group == "g" and bench.extra_info == {"case": "c"}
    with pytest.raises(RuntimeError, match="already used"):
        record_samples(bench, [1.0])


def test_a_disabled_fixture_takes_nothing_but_counts_as_used():
    added = []
    bench = _real_fixture(added, disabled=True)
    record_samples(bench, [1.0])
    assert added == [] and bench._mode
