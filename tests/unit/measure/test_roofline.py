"""harness.measure.limits.roofline: the matmul peaks a row's pct_of_peak is measured against."""

import torch

from harness.measure.limits import roofline


def test_the_fp32_peak_is_the_faster_of_ieee_and_tf32_and_both_are_kept(monkeypatch):
    """fp32 matmuls run as IEEE or as TF32 by torch.get_float32_matmul_precision(): both rates are measured, the
    faster is the fp32 peak (a backend using TF32 must not score above 100 %)."""
    rates = {"highest": 50.0, "high": 400.0}
    monkeypatch.setattr(roofline, "matmul_peak_tflops",
                        lambda device, dtype, *more, **kw: (rates[torch.get_float32_matmul_precision()], None))
    peaks = roofline.best_peaks(roofline.peak_samples(torch.device("cuda"), [torch.float32], 1))
    assert peaks == {"fp32 ieee": 50.0, "fp32 tf32": 400.0, "fp32": 400.0}
