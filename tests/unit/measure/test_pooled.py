"""Issue 65: the backend-level verdict (measure/pooled.py) on seeded keys - its level, its power, the pair rule - and
the two-rounds rule of compare/groups.py."""

import math

import numpy as np
import pytest

from harness.compare.groups import rounds_agree
from harness.measure.pooled import (BURST_FACTOR, SATURATED_SHARE, group_verdict, keys_needed, pair_excluded,
                                    pair_log_ratios)

MARGIN = 1.1


def loaded_keys(rng: np.random.Generator, n: int, change: float, burst_p: float = 0.3) -> np.ndarray:
    """One paired log ratio per key on the loaded machine of tests/fixtures/noise_models.py (LoadedMachine): quiet
    pairs N(0, 0.05), and a burst on either side of a pair with probability burst_p, |N(0, 2)| capped at 4."""
    d = rng.normal(0, 0.05, n) + math.log(change)
    hit = rng.random(n) < burst_p
    d[hit] += rng.choice([-1.0, 1.0], hit.sum()) * np.minimum(np.abs(rng.normal(0, 2.0, hit.sum())), 4.0)
    return d


@pytest.mark.parametrize("n, power", [(12, 0.4), (36, 1.0), (60, 1.0)])
def test_a_doubling_is_slower_and_no_change_never_is(n, power):
    """The level: over 2,000 seeded groups of unchanged keys with bursts on 30 % of the pairs, slower or faster at most
    as often as the level allows (0.05 / 8 each way: a family of 8 groups; the margin makes it rarer still); the
    power: a 2x backend slower in every one of 200 of 36 keys or more (12 keys, where two keys hit by a burst on the
    base side already reach the lower bound, about half: per key, more pairs decide it)."""
    rng = np.random.default_rng(n)
    alpha = 0.05 / 8
    wrong = sum(group_verdict("b", "all", loaded_keys(rng, n, 1.0), MARGIN, alpha).verdict in ("slower", "faster")
                for _ in range(2000))
    assert wrong / 2000 <= 2 * alpha / 4
    found = [group_verdict("b", "all", loaded_keys(rng, n, 2.0), MARGIN, alpha).verdict for _ in range(200)]
    assert found.count("slower") >= power * 200 and "faster" not in found


def test_what_each_verdict_needs():
    alpha = 0.01
    assert group_verdict("b", "fwd", [0.69] * 10, MARGIN, alpha).verdict == "slower"
    assert group_verdict("b", "fwd", [-0.69] * 10, MARGIN, alpha).verdict == "faster"
    flat = group_verdict("b", "fwd", np.linspace(-0.02, 0.02, 10), MARGIN, alpha)
    assert flat.verdict == "unchanged" and flat.ratio == pytest.approx(1.0, abs=1e-9)
    # 6 keys reach no one-sided 1 % level (2^-6 > 0.01): undecided however large the change, and it says so
    few = group_verdict("b", "fwd", [0.69] * 6, MARGIN, alpha)
    assert few.verdict == "undecided" and "at least 7 are needed" in few.note and few.more_pairs >= 1
    # beyond the margin at the centre, but the keys disagree: undecided, with about how many keys would decide it
    split = group_verdict("b", "fwd", [0.3, -0.1, 0.25, 0.2, -0.05, 0.4, 0.3, 0.2, -0.2, 0.15], MARGIN, alpha)
    assert split.verdict == "undecided" and math.isfinite(split.more_pairs) and split.more_pairs > 0
    # a burst of e^4 on one key of 12 is one sign, not a bound (a signed-rank interval's went to e^2)
    assert group_verdict("b", "fwd", [0.0] * 11 + [4.0], MARGIN, alpha).verdict == "unchanged"
    with pytest.raises(ValueError, match="margin=1.0"):
        group_verdict("b", "fwd", [0.1], 1.0, alpha)


def test_keys_needed_shrinks_with_the_effect():
    rng = np.random.default_rng(0)
    d = rng.normal(0, 0.3, 20)
    big, small = keys_needed(d + 0.8, 0.001, math.log(MARGIN)), keys_needed(d + 0.2, 0.001, math.log(MARGIN))
    assert 10 <= big < small
    assert keys_needed(np.array([0.0953] * 5), 0.001, math.log(MARGIN)) == math.inf  # at the margin: no way


def test_which_pairs_count():
    """A pair counts (issue 65 item 3) unless either side's others took SATURATED_SHARE of the CPUs; a steady second
    job's share counts, and so do unequal shares and unknown ones."""
    assert pair_excluded(0.8, 0.75) == "" and pair_excluded(None, None) == "" and pair_excluded(0.2, None) == ""
    assert pair_excluded(0.0, 0.9) == ""
    assert pair_excluded(SATURATED_SHARE, 0.9).startswith("saturated: others took 95%")



def test_a_pair_s_ratio_is_of_its_fastest_samples_and_a_burst_round_is_left_out():
    """What a backend's verdict pools per pair (issue 65 study: under load a 0.05 ms key's whole round read 15-40 ms):
    the fastest sample a side - timing noise only adds - and a round over BURST_FACTOR times its side's fastest round
    of the key left out, on either side; a code change, moving every round of its side, is kept."""
    base = [(1.0, 1.2), (1.1, 1.0), (40.0, 39.0)]  # the third base round: a burst throughout
    new = [(2.0, 2.5), (2.1, 2.0), (2.2, 2.0)]
    assert pair_log_ratios(base, new) == [pytest.approx(math.log(2)), pytest.approx(math.log(2)), None]
    assert pair_log_ratios([(1.0,)], [(9.0,)]) == [pytest.approx(math.log(9))]  # one round: nothing to judge it by
    assert pair_log_ratios([(1.0,), (1.0,)], [(1.0,), (BURST_FACTOR + 0.1,)])[1] is None


def test_two_rounds_must_agree():
    """A verdict must hold on the latest round alone and on the rounds before it: a whole round slow on one side moves
    every key of that round, and must not decide a backend."""
    assert rounds_agree("slower", [0.7] * 5, [0.69] * 5, MARGIN) == ""
    assert rounds_agree("unchanged", [0.01] * 5, [-0.02] * 5, MARGIN) == ""
    slow_round = rounds_agree("slower", [0.4] * 5, [0.0] * 5, MARGIN)
    assert slow_round.startswith("the rounds disagree: the latest round 1.492x, the rounds before it 1.000x")
    assert rounds_agree("slower", [0.7] * 5, [math.nan] * 5, MARGIN).startswith("one round is not enough")
