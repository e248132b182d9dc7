"""A rejected timing is never a number: loading withholds its figures, an earlier round's included, and its
samples (store.load.usable_figures, schema.figures_usable), so every reader of a run sees none of them."""

import pandas as pd

from harness.store.load import load_results, load_samples
from harness.store.schema import REJECTED, SAMPLE_COLUMNS, TIMED, Row, figures_usable


def _run(tmp_path, final_status):
    rows = [Row("r", "c1", "b", "fwd", status="pass"),
            Row("r", "c1", "b", "fwd", timing_status=TIMED, latency_ms=0.01, tflops=900.0, n_samples=3),
            Row("r", "c1", "b", "fwd", timing_status=final_status, timing_reason="round 2 of 2: ..."),
            Row("r", "c2", "b", "fwd", timing_status=TIMED, latency_ms=1.0, n_samples=2)]
    pd.DataFrame([r.as_dict() for r in rows]).to_csv(tmp_path / "results.csv", index=False)
    samples = [("r", "c1", "b", "fwd", 0, i, 0.01) for i in range(3)] + [("r", "c2", "b", "fwd", 0, i, 1.0)
                                                                       for i in range(2)]
    pd.DataFrame(samples, columns=list(SAMPLE_COLUMNS)).to_csv(tmp_path / "samples.csv", index=False)
    return load_results(tmp_path), load_samples(tmp_path)


def test_a_rejected_key_has_no_figure_and_no_samples(tmp_path):
    results, samples = _run(tmp_path, REJECTED)
    c1 = results[results.case_id == "c1"].iloc[0]
    assert c1.timing_status == REJECTED and c1.status == "pass"
    assert pd.isna(c1.latency_ms) and pd.isna(c1.tflops) and pd.isna(c1.n_samples)
    assert set(samples.case_id) == {"c2"}
    assert results[results.case_id == "c2"].iloc[0].latency_ms == 1.0


def test_a_timed_key_keeps_its_figures(tmp_path):
    results, samples = _run(tmp_path, TIMED)
    assert results[results.case_id == "c1"].iloc[0].latency_ms == 0.01 and len(samples) == 5
    assert figures_usable(TIMED) and figures_usable(None) and not figures_usable(REJECTED)
