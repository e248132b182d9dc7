"""A failure that matches a known cheat's signature says so in plain words (issue 48): the reasons below are the
ones the checks gave planted kernels of tests/fixtures/gamed_kernels.py, and an honest failure says nothing more."""

import pytest

from harness.oracle.signatures import signature


@pytest.mark.parametrize("reason, words", [
    # FirstThenEmpty: right on its first call, empty_like after
    ("[fwd, grad] out has NaN/inf where the reference is finite", "output not computed on these inputs"),
    ("RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn",
     "output not computed on these inputs: detached"),
    # WritesInput, ReturnsInput
    ("[fwd, no-grad] wrote into its input v (16384 of 16384 elements)", "writes into its inputs"),
    ("[fwd, no-grad] wrote into its input q (16384 of 16384 elements); its output aliases its input q",
     "returns one of its inputs as its output"),
    # a timed call's answer judged wrong (CachedNoGrad), a slowed clock (ClockAtImport)
    ("timed at median 0.0008 ms, but [fwd, the last call, on new inputs (q,k x-1, v x2, dO x-1)] out err 0.7 > tol "
     "1e-05", "answers from an earlier call"),
    ("timed at median 0.001 ms, but [fwd, a call on the round's inputs (q,k x-1, v x2, dO x-1)] out err 0.7 > tol "
     "1e-05", "answers from an earlier call"),
    ("the backend process's clock disagrees with the run's: 1.9 ms claimed in 10.2 ms of calls",
     "clock was slowed or rewritten"),
])
def test_a_planted_cheats_reason_is_named_in_plain_words(reason, words):
    assert words in signature(reason)


@pytest.mark.parametrize("reason", ["[fwd, grad] out err max|out - ref| = 0.697 > tol 1.11e-05",
                                    "dq err 0.3 > dq_tol 0.2", "", None])
def test_an_honest_wrong_answer_is_not_called_a_cheat(reason):
    assert signature(reason) is None
