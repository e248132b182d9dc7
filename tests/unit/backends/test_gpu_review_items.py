"""The reviewed GPU defects whose fix is plain Python, proven on CPU with fakes where a library needs CUDA.

Checked against torch 2.13 (torch/backends/cuda/__init__.py: SDPAParams, can_use_*(params, debug);
torch/nn/attention/__init__.py: SDPBackend; torch._fused_sdp_choice) and xformers 0.0.35
(xformers/__init__.py: _has_cpp_library; xformers/_cpp_lib.py: _cpp_library_load_exception)."""

import os
import warnings

import pytest
import torch
from torch.nn.attention import SDPBackend

from harness import AttentionCase
from harness.backends import sdpa as sdpa_module
from harness.backends import xformers as xformers_module
from harness.backends.base import Unsupported
from harness.backends.registry import get_backends
from harness.execution.outcome import BackendResult
from harness.spec.masks import Causal

CPU = torch.device("cpu")
CASE = AttentionCase(2, 4, 64, 32, "fp32", mask=Causal())


def test_item3_xformers_reports_its_own_load_failure(monkeypatch):
    """A wheel whose extension does not load: the backend is unavailable with xformers' own cause, not a guess
    (the exception chain itself is rebuilt in tests/unit/backends/test_xformers_load.py)."""
    import types
    fake = types.SimpleNamespace(_has_cpp_library=False, __version__="0.0.35")
    monkeypatch.setattr(xformers_module, "_import_xformers", lambda: fake)
    import xformers._cpp_lib as cpp_lib
    monkeypatch.setattr(cpp_lib, "_cpp_library_load_exception", OSError("libfoo.so: cannot open shared object"))
    problem = xformers_module.load_problem()
    assert "could not load its extension _C.so (OSError: libfoo.so: cannot open shared object)" in problem
    backend = get_backends(["xformers"])[0]
    assert backend.unavailable_reason(torch.device("cuda")) == problem  # unavailable, with xformers' words


def test_item7_verdicts_kept_for_later_stages_hold_no_tensors():
    big = torch.zeros(1000)
    result = BackendResult([], {}, out=big, grads={"dq": big})
    kept = result.released()
    assert kept.out is None and not kept.grads and kept.rows is result.rows


def test_item9_plain_sdpa_records_the_kernel_sdpa_chose(monkeypatch):
    backend = get_backends(["sdpa"])[0]
    assert backend.prepare(CASE, CPU).op in ("sdpa:flash", "sdpa:math")  # what torch picks on CPU
    # on sm90 with a recent cuDNN, torch prefers cuDNN: whatever it picks is what the row says
    monkeypatch.setattr(torch, "_fused_sdp_choice", lambda *a, **k: SDPBackend.CUDNN_ATTENTION.value)
    plan = backend.prepare(CASE, CPU)
    assert plan.op == "sdpa:cudnn"
    q = k = v = torch.randn(2, 4, 64, 32)
    backend.forward(q, k, v, mask=Causal(), scale=CASE.scale, prepared=plan)
    assert backend.ops(plan, training=False) == ("sdpa:cudnn", "sdpa:cudnn")


def test_item10_cudnn_plan_errors_are_refusals_not_errors():
    def plan_error():
        raise RuntimeError("cuDNN Frontend error: No execution plans support the graph.\nmore detail")
    with pytest.raises(Unsupported, match="cuDNN refused: cuDNN Frontend error: No execution plans support"):
        sdpa_module._cudnn_refusals(plan_error)

    def other():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        sdpa_module._cudnn_refusals(other)


def test_item10_pinned_kernel_refusals_carry_torchs_reasons_every_time(monkeypatch):
    """torch warns a refusal's reasons with TORCH_WARN_ONCE on a refused call; can_use_*(params, debug=True)
    gives them on every check, so the second refused case still says why."""
    def refuse(params, debug):
        warnings.warn("Flash attention requires head_dim <= 256; got 512")
        return False
    monkeypatch.setattr(torch.backends.cuda, "can_use_flash_attention", refuse)
    q = torch.empty(1, 2, 8, 512)
    for _ in range(2):
        with pytest.raises(Unsupported, match="FLASH_ATTENTION refused: Flash attention requires head_dim <= 256"):
            sdpa_module._refused_why(SDPBackend.FLASH_ATTENTION, q, q, q, {}, False)


def test_item11_fp32_roofline_is_the_faster_of_ieee_and_tf32(monkeypatch):
    from harness.measure import roofline
    rates = {"highest": 50.0, "high": 400.0}
    monkeypatch.setattr(roofline, "matmul_peak_tflops",
                        lambda device, dtype: (rates[torch.get_float32_matmul_precision()], None))
    peaks = roofline.measure_peaks(torch.device("cuda"), [torch.float32])
    assert peaks == {"fp32 ieee": 50.0, "fp32 tf32": 400.0, "fp32": 400.0}


def test_item11_tf32_settings_and_overrides_are_recorded(monkeypatch):
    from harness.store.environment import tf32_settings
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")
    settings = tf32_settings()
    assert settings["NVIDIA_TF32_OVERRIDE"] == "0" and settings["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] == "1"
    assert {"matmul", "cudnn", "float32_matmul_precision"} <= set(settings)


def test_item10_reasons_torch_writes_to_stderr_are_kept(monkeypatch, capfd):
    """On an H200 (torch 2.11) the can_use_* checks wrote their reasons as C++ warnings on fd 2, never through
    Python's warnings, and every refusal read "torch's checks refused these inputs". The line below is the one
    seen there; it is written to fd 2 the way c10's default warning handler writes it."""
    seen = ("[W1130 14:36:21.387796355 sdp_utils_cpp.h:262] Warning: Flash Attention does not support non-null "
            "attn_mask. (function check_for_attn_mask)\n")

    def refuse(params, debug):
        os.write(2, seen.encode())
        os.write(2, b"unrelated output\n")
        return False
    monkeypatch.setattr(torch.backends.cuda, "can_use_flash_attention", refuse)
    q = torch.empty(1, 2, 8, 64)
    with pytest.raises(Unsupported) as refused:
        sdpa_module._refused_why(SDPBackend.FLASH_ATTENTION, q, q, q, {}, False)
    assert str(refused.value) == "FLASH_ATTENTION refused: Flash Attention does not support non-null attn_mask."
    assert "unrelated output" in capfd.readouterr().err  # what is not a warning goes back to stderr


def test_captured_stderr_gives_back_what_c_code_wrote_even_when_the_block_raises(capfd):
    from harness.backends.native_stderr import captured_stderr

    with pytest.raises(RuntimeError):
        with captured_stderr() as lines:
            os.write(2, b"kineto: profiler started\n")
            raise RuntimeError("kernel refused")
    assert lines == ["kineto: profiler started"] and capfd.readouterr().err == ""
    os.write(2, b"after\n")  # fd 2 is the terminal's again
    assert capfd.readouterr().err == "after\n"
