"""The mixed serving step end to end: the default matrix's two steps (paged bf16, contiguous fp32) through
`pytest suites --benchmark` with naive, sdpa and flex (harness.check on plugins: tests/unit/oracle/
test_verdict_power_mixed.py)."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
from tests.e2e import the_run

ROOT = Path(__file__).resolve().parents[2]
#: the default matrix's mixed steps' ids carry this (8 sequences: queries 1 to 24)
STEP_KEY = "q1to24"


def test_the_default_matrix_steps_pass_and_are_timed_with_naive_sdpa_and_flex(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pytest", "suites", "-p", "no:cacheprovider", "-ra",
                          "--results-dir", str(tmp_path), "--matrix", "default", "--backends", "naive,sdpa,flex",
                          "--benchmark", "--rounds", "1", "--timing-budget-ms", "5", "--no-report", "-k", STEP_KEY],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:]
    df = pd.read_csv(the_run(tmp_path) / "results.csv")
    steps = df[df.case_id.str.contains(STEP_KEY)]
    assert set(steps.case_id.str.endswith("-page16")) == {True, False}        # the paged step and the contiguous one
    fwd = steps[steps.phase == "fwd"]
    assert len(fwd) == 6 and set(fwd.status) == {"pass"} and fwd.timing_status.eq("timed").all(), fwd
    assert (fwd.gbps > 0).all()
    paged_bwd = steps[(steps.phase == "bwd") & steps.case_id.str.endswith("-page16")]
    assert set(paged_bwd.status) == {"unsupported"}
    # the contiguous step has gradients: naive's and sdpa's backward are judged (flex has none on CPU)
    bwd = steps[(steps.phase == "bwd") & ~steps.case_id.str.endswith("-page16")].set_index("backend")
    assert bwd.loc["naive", "status"] == bwd.loc["sdpa", "status"] == "pass"



def test_the_default_matrix_fp8_cases_pass_and_are_timed_with_quant_err_beside(tmp_path):
    """The two FP8 KV cases (a paged verification per head, a causal prefill per tensor) with naive, sdpa and flex:
    judged on the dequantized values, timed with the dequantization inside the call, quant_err on every fwd row."""
    res = subprocess.run([sys.executable, "-m", "pytest", "suites", "-p", "no:cacheprovider", "-ra",
                          "--results-dir", str(tmp_path), "--matrix", "default", "--backends", "naive,sdpa,flex",
                          "--benchmark", "--rounds", "1", "--timing-budget-ms", "5", "--no-report", "-k", "fp8kv"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:]
    df = pd.read_csv(the_run(tmp_path) / "results.csv")
    fwd = df[df.phase == "fwd"]
    assert len(fwd) == 6 and set(fwd.status) == {"pass"} and fwd.timing_status.eq("timed").all(), fwd
    assert set(fwd.fp8_kv) == {"head", "tensor"} and (fwd.quant_err > fwd.out_err).all()
    assert fwd.backend_op.str.contains("FP8 K/V dequantized inside the timed call").all()
    assert set(df[df.phase == "bwd"].status) == {"unsupported"}


def test_the_full_matrix_fp8_qkv_cases_pass_and_are_timed_with_naive_sdpa_and_flex(tmp_path):
    """The two FP8 Q/K/V cases of `full` (not in default: its CPU budget) - a paged verification per kv-head group,
    a causal prefill per tensor, the FP8 KV cases' shapes - with naive, sdpa and flex: q, K and V dequantized inside
    the timed call, judged on the dequantized values, bf16 out, quant_err beside, fp8_q on the rows."""
    res = subprocess.run([sys.executable, "-m", "pytest", "suites", "-p", "no:cacheprovider", "-ra",
                          "--results-dir", str(tmp_path), "--matrix", "full", "--backends", "naive,sdpa,flex",
                          "--benchmark", "--rounds", "1", "--timing-budget-ms", "5", "--no-report", "-k", "fp8qkv"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:]
    df = pd.read_csv(the_run(tmp_path) / "results.csv")
    fwd = df[df.phase == "fwd"]
    assert len(fwd) == 6 and set(fwd.status) == {"pass"} and fwd.timing_status.eq("timed").all(), fwd
    assert set(fwd.fp8_kv) == {"head", "tensor"} and fwd.fp8_q.all() and (fwd.quant_err > fwd.out_err).all()
    assert fwd.backend_op.str.contains("FP8 Q/K/V dequantized inside the timed call").all()
    assert (fwd.gbps > 0).all() and set(df[df.phase == "bwd"].status) == {"unsupported"}
