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
from harness.store.schema import FASTER, SLOWER, UNCHANGED, UNDECIDED, TIMING_VERDICTS as VERDICTS  # noqa: E402

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
    if loaded:  # a loaded run's rounds settle no change, in either direction
        assert v.verdict not in (SLOWER, FASTER)


def test_a_loaded_run_that_looks_faster_is_undecided_not_unchanged():
    """Seen in CI: the base run of a 2x slower kernel caught a burst of load, so the new run read 0.2x and passed as
    'possibly faster'; with a loaded run that key is undecided (compare --remeasure decides it), as a slower one is."""
    base = [5.0, 5.2, 4.9, 5.1]  # inflated by the burst
    new = [1.0, 1.02, 0.98, 1.01]
    rounds = [0, 0, 1, 1]
    quiet = gate_verdict(base, new, base_rounds=rounds, new_rounds=rounds)
    assert quiet.verdict in (UNCHANGED, FASTER)
    loaded = gate_verdict(base, new, base_rounds=rounds, new_rounds=rounds, loaded="base run start: load average 3.1")
    assert loaded.verdict == UNDECIDED and "loaded machine" in loaded.note and "--remeasure" in loaded.note


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
