"""compare answers any stored samples - zeros, infinities, NaN, single samples, identical values, extreme
ratios, a run made under load - with exit 0, 1 or 3 and a table, or 2 and one line; never a traceback (issue 35;
hypothesis, the `test` extra: skipped with the reason where it is not installed)."""

import math

import numpy as np
import pytest

pytest.importorskip("hypothesis", reason="hypothesis is in the test extra: pip install -e '.[test]'")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from harness.compare.runs import EXIT_OK, EXIT_REGRESSION, EXIT_UNDECIDED  # noqa: E402
from tests.fixtures.regress_fixtures import key, write_run  # noqa: E402
from tests.unit.compare.test_gate_under_load import harness, loaded  # noqa: E402

LATENCY = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0.0, math.inf, math.nan, 1e-300, 1e300, 1.0]))
ROUND = st.lists(LATENCY, min_size=1, max_size=6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(base=st.lists(ROUND, min_size=1, max_size=3), new=st.lists(ROUND, min_size=1, max_size=3),
       busy=st.booleans())
def test_compare_answers_any_stored_samples(tmp_path_factory, capsys, base, new, busy):
    """Sample sets with zeros, infinities, single samples, identical values and extreme ratios: exit 0, 1 or 3
    with a table, or 2 with one line - never a traceback."""
    root = tmp_path_factory.mktemp("runs")
    k = key(0)
    a = write_run(root / "a", {k: {}}, {k: [np.array(r) for r in base]})
    b = write_run(root / "b", {k: {}}, {k: [np.array(r) for r in new]})
    if busy:
        loaded(b)
    res = harness(capsys, "compare", str(a), str(b), "--out", str(root / "out"))
    assert res.returncode in (EXIT_OK, EXIT_REGRESSION, EXIT_UNDECIDED, 2), res
    if res.returncode == 2:
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    else:
        assert "Traceback" not in res.stdout + res.stderr
    if busy:
        assert res.returncode != EXIT_REGRESSION
