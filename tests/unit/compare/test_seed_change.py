"""Two runs drawn from different seeds judged other inputs: the gate's correctness rule must not read their
error figures' difference as a regression (each run draws its own seed now), while a status change still counts."""

import pandas as pd

from harness.compare.decision import correctness_change


def test_err_growth_counts_only_between_runs_of_the_same_inputs():
    base, new = pd.Series({"status": "pass", "err_ratio": 0.1}), pd.Series({"status": "pass", "err_ratio": 0.6})
    assert correctness_change(base, new)[0] == "worse"
    assert correctness_change(base, new, same_inputs=False) == ("same", "")


def test_a_status_change_counts_whatever_the_seeds():
    base, new = pd.Series({"status": "pass", "err_ratio": 0.1}), pd.Series({"status": "fail", "err_ratio": 3.0})
    assert correctness_change(base, new, same_inputs=False)[0] == "worse"
