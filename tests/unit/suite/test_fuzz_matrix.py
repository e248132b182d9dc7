"""`pytest suites --matrix fuzz`: the suites' cases drawn from --seed within --fuzz-budget-s, the seed fixed first."""

from argparse import Namespace

import torch

from harness.backends.registry import get_backends
from harness.fuzzing.fuzz import plan
from harness.suite.plugin import suite_cases


def test_the_fuzz_matrix_draws_the_seeds_cases_for_the_backends():
    option = Namespace(preset=None, hf_config=None, batch=None, seq=None, matrix="fuzz", seed=None, fuzz_budget_s=2.0)
    backends, cpu = get_backends("naive,sdpa-math"), torch.device("cpu")
    label, cases = suite_cases(option, cpu, backends)
    assert label == "fuzz" and cases and isinstance(option.seed, int)          # a drawn seed, recorded by the run
    assert cases == [p.case for p in plan(backends, cpu, option.seed, 2.0)]


def test_a_seeds_plan_is_the_seeds_alone_not_the_machines_measured_rates(monkeypatch):
    """The plan is sized by fixed unit costs and rates (rates.FITTED, FITTED_FLOP_RATES): no rate is measured, so a
    seed plans the same cases on any machine of a device type and at any load (rates measured at the start once
    planned 12 then 13 cases)."""
    from harness.planning import cost

    def measured(*_):
        raise AssertionError("the fuzz plan measured a rate")

    monkeypatch.setattr(cost, "baseline_rate", measured)
    monkeypatch.setattr(cost, "reference_rate", measured)
    backends, cpu = get_backends("naive,sdpa"), torch.device("cpu")
    first = [p.case for p in plan(backends, cpu, 0, 5.0)]
    assert first and first == [p.case for p in plan(backends, cpu, 0, 5.0)]
