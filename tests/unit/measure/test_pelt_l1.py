"""The compiled PELT-l1 gives ruptures' own breakpoints: seeded random series, with and without level shifts, ties."""

import numpy as np
import pytest
import ruptures as rpt

from harness.measure.pelt_l1 import pelt_l1_ends


def series(seed: int) -> np.ndarray:
    """A z-scored-looking series: noise, maybe steps, maybe outliers, maybe coarse values (equal values, tied costs)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(6, 60))
    z = rng.standard_t(3, n) if seed % 3 == 0 else rng.normal(0, 1, n)
    for at in rng.integers(1, n, int(rng.integers(0, 4))):  # 0-3 level shifts of a few sigmas
        z[at:] += rng.normal(0, 4)
    if seed % 4 == 0:
        z = np.round(z * 2) / 2  # quantised: many equal values
    if seed % 7 == 0:
        z[rng.integers(0, n)] += 30  # an outlier
    return z


@pytest.mark.parametrize("block", range(2))
def test_same_ends_as_ruptures(block):
    for seed in range(block * 50, block * 50 + 50):
        z = series(seed)
        for pen in (12.0, 3.0):
            expected = rpt.Pelt(model="l1", min_size=3, jump=1).fit(z.reshape(-1, 1)).predict(pen=pen)
            assert list(pelt_l1_ends(z, pen, 3)) == expected, (seed, pen)


def test_constant_and_shortest_series():
    for z in (np.zeros(6), np.ones(40), np.r_[np.zeros(20), np.ones(20) * 50]):
        expected = rpt.Pelt(model="l1", min_size=3, jump=1).fit(z.reshape(-1, 1)).predict(pen=12.0)
        assert list(pelt_l1_ends(z, 12.0, 3)) == expected


def test_change_points_as_with_ruptures(monkeypatch):
    """change_points (log, robust scale, compiled PELT) gives what ruptures' Pelt gives, on latencies with steps;
    without numba it is ruptures' Pelt."""
    import sys

    from harness.measure import stats

    series = []
    for seed in range(30):
        rng = np.random.default_rng(1000 + seed)
        n = int(rng.integers(6, 80))
        ms = 2.0 * np.exp(rng.normal(0, 0.03, n))
        if seed % 2:
            ms[int(rng.integers(3, n - 2)):] *= rng.choice([0.7, 1.3])
        if seed % 5 == 0:
            ms = np.round(ms, 2)  # latencies of few digits: equal values
        series.append(ms)
        assert stats.change_points(ms) == stats.ruptures_change_points(np.log(ms)), seed
    assert any(stats.change_points(ms) for ms in series)  # some steps are found
    monkeypatch.setitem(sys.modules, "harness.measure.pelt_l1", None)  # import fails: as where numba is missing
    assert [stats.change_points(ms) for ms in series[:6]] == [stats.ruptures_change_points(np.log(ms))
                                                              for ms in series[:6]]
