"""The unit costs are data a script refits from runs' stage clocks (scripts/refit_rates.py), never hand-copied: a
run's counts and stage seconds give key_round_s, call_s and judged_per_s; the package's file loads as RunRates and an
estimate at extrapolated costs says so."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from harness.backends.naive import Naive
from harness.cases.case import AttentionCase
from harness.cases.matrices import build_matrix
from harness.planning import rates
from harness.planning.cost import Job, job_cost, matrix_cost
from harness.run.session import RunSession
from harness.store.schema import FWD
from tests.conftest import ROOT

CPU = torch.device("cpu")


def _refit():
    spec = importlib.util.spec_from_file_location("refit_rates", ROOT / "scripts" / "refit_rates.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_package_s_unit_costs_load_as_run_rates():
    fits = rates.load_unit_costs()
    assert set(fits) == {"cpu", "cpu-loaded", "cuda"} and rates.FITTED["cuda"] is rates.H200
    assert all(f.fitted for f in fits.values()) and fits["cuda"].device_type == "cuda"
    assert rates.H200.extrapolated  # no GPU has run since verdicts moved to the device


def test_an_estimate_at_extrapolated_costs_says_so():
    matrix = matrix_cost([AttentionCase(1, 2, 64, 32, "fp32")], CPU, rate=1e9, baseline_rates={torch.float32: 1e9},
                         memory=2 ** 30)
    measured = job_cost(matrix, Job(()), rates.CPU_QUIET).summary()
    guessed = job_cost(matrix, Job(()), rates.replace(rates.CPU_QUIET, extrapolated="call_s from nothing")).summary()
    assert "extrapolation" not in measured and guessed.endswith(
        "An extrapolation: call_s from nothing (scripts/refit_rates.py refits them from a run's stage clocks).")


def test_a_run_s_stage_clocks_refit_its_device_s_entry(tmp_path, capsys):
    session = RunSession(CPU, tmp_path / "results", rounds=1)
    case, naive = AttentionCase(2, 4, 512, 64, "fp32"), Naive()  # large enough that judging takes milliseconds
    verdict = session.check(case, naive)
    session.benchmark_round(case, naive, FWD, 0, verdict)
    # suite stages' seconds larger than any real stage clock here, whatever the machine's load
    session.recorder.add_test_seconds("correctness", 1000.0)
    session.recorder.add_test_seconds("benchmark", 500.0)
    session.finish()
    spent = json.loads((session.run_dir / "env.json").read_text())["time_spent"]
    costs = tmp_path / "unit_costs.json"
    costs.write_text(rates.UNIT_COSTS.read_text())
    assert _refit().main([str(session.run_dir), "--file", str(costs), "--write"]) == 0
    entry = json.loads(costs.read_text())["cpu"]
    assert entry["key_round_s"] == pytest.approx(500.0 - 0.125, rel=1e-3)  # one round, less its 125 ms budget
    arithmetic = sum(spent["stages"].get(s, {}).get("s", 0.0)
                     for s in ("reference", "naive baseline", "judging", "forward", "backward"))
    assert entry["call_s"] == pytest.approx(1000.0 - arithmetic, rel=1e-3)
    # out twice (the no-grad call's and the training call's), dq, dk, dv: 5 x 2 x 4 x 512 x 64 elements
    assert entry["judged_per_s"] == pytest.approx(5 * 2 * 4 * 512 * 64 / spent["stages"]["judging"]["s"], rel=1e-3)
    assert entry["fitted"].startswith(f"{__import__('datetime').date.today()}: key_round_s over 1 timed rounds")
    assert "cpu.call_s" in capsys.readouterr().out
    assert rates.load_unit_costs(costs)["cpu"].call_s == entry["call_s"]


def test_runs_without_counts_or_of_another_device_type_are_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "env.json").write_text(json.dumps({"device": "cpu", "time_spent": {"wall_s": 1.0, "stages": {}}}))
    with pytest.raises(SystemExit, match="no counts"):
        _refit().main([str(run)])
    (run / "env.json").write_text(json.dumps({"device": "cpu", "time_spent": {
        "wall_s": 1.0, "stages": {}, "counts": {"checked": 1}, "tests_s": {"correctness": 1.0}}}))
    with pytest.raises(SystemExit, match="a cuda entry; the runs are cpu"):
        _refit().main([str(run), "--entry", "cuda"])
