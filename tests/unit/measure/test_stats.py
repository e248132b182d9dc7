"""harness.measure.stats: the within-run verdict on two sets of latency samples (the advisor's tie groups), on
seeded synthetic samples (lognormal noise around a chosen median), never on this machine's timings."""

import math
from math import comb

import numpy as np
import pytest

from harness.measure import stats
from harness.store.schema import NOT_TIMED


def samples(median_ms: float, n: int, seed: int, sigma: float = 0.03) -> np.ndarray:
    return median_ms * np.random.default_rng(seed).lognormal(0.0, sigma, n)


def test_iqr_is_numpys_interquartile_range_and_nan_for_no_samples():
    assert stats.iqr([1, 2, 3, 4, 5]) == 2.0
    assert stats.iqr([3.0]) == 0.0
    assert math.isnan(stats.iqr([]))


def test_the_least_attainable_p_is_that_of_complete_separation():
    assert stats.min_attainable_p(10, 10) == pytest.approx(2 / comb(20, 10))
    assert stats.min_attainable_p(1, 1) == 1.0  # one sample each can never be significant


@pytest.mark.parametrize("seed", range(5))
def test_two_draws_from_one_distribution_are_unchanged(seed):
    assert stats.timing_verdict(samples(1.0, 60, seed), samples(1.0, 60, seed + 100)).verdict == "unchanged"


@pytest.mark.parametrize("seed", range(5))
def test_a_third_slower_is_slower_and_the_other_way_faster(seed):
    base, new = samples(1.0, 60, seed), samples(1.33, 60, seed + 100)
    slower = stats.timing_verdict(base, new)
    assert slower.verdict == "slower" and slower.ratio == pytest.approx(1.33, rel=0.03) and slower.p_value < 0.002
    assert stats.timing_verdict(new, base).verdict == "faster"


def test_a_change_below_the_least_effect_that_counts_is_unchanged_however_significant():
    base, new = samples(1.0, 200, 1, sigma=0.001), samples(1.02, 200, 2, sigma=0.001)  # 2 %, p ~ 0
    verdict = stats.timing_verdict(base, new)
    assert verdict.p_value < 1e-10 and verdict.verdict == "unchanged"


def test_too_few_samples_give_no_call_however_large_the_difference():
    verdict = stats.timing_verdict(samples(1.0, 5, 1), samples(2.0, 5, 2))
    assert verdict.verdict not in ("slower", "faster", "unchanged") and "too few samples (5 vs 5" in verdict.note


def test_a_change_that_does_not_hold_across_rounds_gives_no_call():
    """One new round far off (a transient) moves the pooled samples, not the medians of every round."""
    base = np.concatenate([samples(1.0, 20, r) for r in range(3)])
    new = np.concatenate([samples(m, 20, 10 + r) for r, m in enumerate((1.0, 1.3, 1.6))])
    rounds = np.repeat(np.arange(3), 20)
    verdict = stats.timing_verdict(base, new, base_rounds=rounds, new_rounds=rounds)
    assert verdict.ratio > 1.2 and verdict.p_value < 0.002 and verdict.round_p >= 0.002
    assert verdict.verdict not in ("slower", "faster", "unchanged") and "not across rounds" in verdict.note
    steady = np.concatenate([samples(1.3, 20, 20 + r) for r in range(3)])  # every round moved: the change holds
    assert stats.timing_verdict(base, steady, base_rounds=rounds, new_rounds=rounds).verdict == "slower"


def test_no_samples_is_not_timed_and_samples_on_one_side_only_give_no_call():
    assert stats.timing_verdict([], []).verdict == NOT_TIMED
    one_sided = stats.timing_verdict([], samples(1.0, 20, 1))
    assert one_sided.verdict not in ("slower", "faster", "unchanged", NOT_TIMED)
    assert one_sided.note == "samples only in the new run" and one_sided.n_new == 20


def test_the_round_test_needs_two_rounds_a_side():
    x = samples(1.0, 20, 1)
    p, base_medians, new_medians = stats.round_test(x, x, np.zeros(20, int), np.zeros(20, int))
    assert math.isnan(p) and len(base_medians) == len(new_medians) == 1
