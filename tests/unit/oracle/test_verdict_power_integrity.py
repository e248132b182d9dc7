"""Planted kernels that pass one call and cheat on another must fail correctness, which now judges the call
inference makes (no autograd) and the training call, each with its inputs left as given and its output its own
(harness.calls.call, runner; docs/integrity.md). The kernels are tests/fixtures/gamed_kernels.py."""

import pytest

from harness import AttentionCase
from harness.calls.device import resolve_device
from harness.run.session import run_seed
from harness.run.runner import execute, prepare_case
from harness.cases.masks import Causal
from tests.fixtures import gamed_kernels as gamed

CPU = resolve_device("cpu")
CASE = AttentionCase(1, 2, 16, 32, "fp32")
CAUSAL = AttentionCase(1, 2, 16, 32, "fp32", mask=Causal())


def _fwd(backend, case=CASE, seed=0):
    result = execute(backend, prepare_case(case, CPU, seed))
    return result.row("fwd"), result.row("bwd")


@pytest.mark.parametrize("kernel, case, path, words", [
    (gamed.FirstThenEmpty, CASE, "[fwd, grad]", "out"),
    (gamed.MaskDroppedNoGrad, CAUSAL, "[fwd, no-grad]", "out err"),
    (gamed.BackgroundFill, CASE, "[fwd, no-grad]", "out"),
    (gamed.WritesInput, CASE, "[fwd, no-grad]", "wrote into its input v"),
    (gamed.ReturnsInput, CASE, "[fwd, no-grad]", "aliases its input q"),
])
def test_a_kernel_whose_calls_disagree_fails_naming_the_path(kernel, case, path, words):
    fwd, _ = _fwd(kernel(), case)
    assert fwd.status == "fail" and path in fwd.reason and words in fwd.reason, fwd.reason


def test_the_fwd_row_holds_the_worse_of_the_two_calls():
    fwd, _ = _fwd(gamed.MaskDroppedNoGrad(), CAUSAL)
    assert fwd.out_err > fwd.out_tol and fwd.err_ratio > 1  # the no-grad call's error, not the training call's


def test_a_lookup_table_of_seed_0_fails_on_a_drawn_seed():
    table = gamed.SeededTable()
    table.case = CASE
    assert _fwd(table, seed=0)[0].status == "pass"  # what it was built for
    seed = run_seed(None)
    assert seed != 0 and _fwd(table, seed=seed)[0].status == "fail"


def test_run_seed_is_drawn_unless_given():
    assert run_seed(7) == 7
    assert len({run_seed(None) for _ in range(5)}) > 1


@pytest.mark.parametrize("kernel", [gamed.Recomputing, gamed.Nondeterministic, gamed.CaseCache])
def test_honest_controls_pass_both_phases(kernel):
    fwd, bwd = _fwd(kernel(), CAUSAL if kernel is gamed.CaseCache else CASE)
    assert (fwd.status, bwd.status) == ("pass", "pass"), (fwd.reason, bwd.reason)
