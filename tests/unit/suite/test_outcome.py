"""harness.suite.outcome.conclude: the one way rows become a pytest outcome (correctness and probe suites)."""

import pytest

from harness.store.schema import BWD, ERROR, FAIL, FWD, OBSERVED, OOM, PASS, UNAVAILABLE, UNSUPPORTED, Row
from harness.suite.outcome import conclude


def _row(phase: str, status: str, reason: str = "") -> Row:
    return Row(run_id="r", case_id="c", backend="b", phase=phase, status=status, reason=reason)


@pytest.mark.parametrize("statuses", [(PASS, PASS), (PASS, UNSUPPORTED), (OBSERVED,)])
def test_a_judged_or_observed_answer_with_nothing_wrong_passes(statuses):
    conclude([_row(phase, s) for phase, s in zip((FWD, BWD), statuses)])  # returns: the test passes


@pytest.mark.parametrize("bad", [FAIL, ERROR])
def test_a_wrong_answer_or_a_raise_fails_with_phase_status_and_reason(bad):
    with pytest.raises(pytest.fail.Exception, match=f"bwd: {bad}: dq off"):
        conclude([_row(FWD, PASS), _row(BWD, bad, "dq off")])


def test_nothing_run_skips_with_each_reason_once():
    rows = [_row(FWD, UNAVAILABLE, "needs CUDA"), _row(BWD, UNAVAILABLE, "needs CUDA")]
    with pytest.raises(pytest.skip.Exception) as skipped:
        conclude(rows)
    assert str(skipped.value) == "unavailable: needs CUDA"


def test_out_of_memory_skips_even_when_another_phase_passed():
    """The device's limit is not a wrong answer, and a test whose backward did not run is not a pass."""
    with pytest.raises(pytest.skip.Exception, match="oom: out of memory"):
        conclude([_row(FWD, PASS), _row(BWD, OOM, "out of memory: 2 GiB")])


def test_a_known_failure_is_xfail_when_it_fails_and_a_failure_when_it_passes():
    with pytest.raises(pytest.xfail.Exception, match="known limitation: fp16 overflow"):
        conclude([_row(FWD, FAIL, "inf")], known_failure="fp16 overflow")
    with pytest.raises(pytest.fail.Exception, match="but did not"):
        conclude([_row(FWD, PASS)], known_failure="fp16 overflow")
