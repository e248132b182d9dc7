"""The gate's verdict functions answer anything stored data can hold - zeros, infinities, NaN, single samples,
identical values, extreme ratios - with a verdict and a one-line note, never a traceback (issue 35; hypothesis,
the `test` extra: skipped with the reason where it is not installed)."""

import math

import pytest

pytest.importorskip("hypothesis", reason="hypothesis is in the test extra: pip install -e '.[test]'")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from harness.measure.paired import paired_verdict  # noqa: E402
from harness.measure.stats import gate_verdict  # noqa: E402
from harness.store.schema import SLOWER, UNCHANGED, UNDECIDED, TIMING_VERDICTS as VERDICTS  # noqa: E402

LATENCY = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64),
                    st.sampled_from([0.0, -1.0, math.inf, -math.inf, math.nan, 1e-300, 1e300, 5e-324, 1.0]))


def _sound(v):
    assert v.verdict in VERDICTS and "\n" not in v.note
    assert all(isinstance(getattr(v, f), float) for f in ("ratio", "ratio_low", "ratio_high", "margin"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.lists(LATENCY, max_size=12), new=st.lists(LATENCY, max_size=12),
       rounds=st.integers(1, 4), loaded=st.booleans())
def test_gate_verdict_answers_any_samples(base, new, rounds, loaded):
    v = gate_verdict(base, new, base_rounds=[i % rounds for i in range(len(base))],
                     new_rounds=[i % rounds for i in range(len(new))], loaded="load average 5" if loaded else "")
    _sound(v)
    if loaded:
        assert v.verdict != SLOWER


@settings(max_examples=300, deadline=None)
@given(pairs=st.lists(st.tuples(LATENCY, LATENCY), max_size=14), alpha=st.floats(1e-6, 0.49),
       load=st.none() | st.tuples(st.floats(0, 50), st.integers(1, 64)))
def test_paired_verdict_answers_any_pairs(pairs, alpha, load):
    base, new = [b for b, _ in pairs], [n for _, n in pairs]
    _sound(paired_verdict(base, new, alpha=alpha, load=load))


@settings(max_examples=100, deadline=None)
@given(value=st.floats(0.001, 1e6), n=st.integers(1, 14))
def test_identical_values_are_unchanged_or_undecided_never_a_change(value, n):
    assert paired_verdict([value] * n, [value] * n).verdict in (UNCHANGED, UNDECIDED)
    assert gate_verdict([value] * n, [value] * n).verdict == UNCHANGED
