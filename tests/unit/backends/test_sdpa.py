"""The SDPA backend's plain-Python logic on CPU: the kernel torch chose is the one recorded, and a pinned kernel's
refusal is Unsupported with torch's own reasons (on every refused case), a cuDNN plan error a refusal too.

Checked against torch 2.13 (torch/backends/cuda/__init__.py: SDPAParams, can_use_*(params, debug);
torch/nn/attention/__init__.py: SDPBackend; torch._fused_sdp_choice). What an H200 (torch 2.11) showed is quoted
where a test pins it."""

import os
import warnings

import pytest
import torch
from torch.nn.attention import SDPBackend

from harness.backends import sdpa as sdpa_module
from harness.backends.base import Unsupported
from harness.backends.registry import get_backends
from harness.cases.case import AttentionCase
from harness.cases.masks import Causal

CPU = torch.device("cpu")
CASE = AttentionCase(2, 4, 64, 32, "fp32", mask=Causal())


def test_plain_sdpa_records_the_kernel_torch_chose(monkeypatch):
    backend = get_backends(["sdpa"])[0]
    assert backend.prepare(CASE, CPU).op in ("sdpa:flash", "sdpa:math")  # what torch picks on CPU
    # on sm90 with a recent cuDNN, torch prefers cuDNN: whatever it picks is what the row says
    monkeypatch.setattr(torch, "_fused_sdp_choice", lambda *a, **k: SDPBackend.CUDNN_ATTENTION.value)
    plan = backend.prepare(CASE, CPU)
    assert plan.op == "sdpa:cudnn"
    q = k = v = torch.randn(2, 4, 64, 32)
    backend.forward(q, k, v, mask=Causal(), scale=CASE.scale, prepared=plan)
    assert backend.ops(plan, training=False) == ("sdpa:cudnn", "sdpa:cudnn")


def test_a_cudnn_plan_error_is_a_refusal_and_another_cuda_error_is_not():
    def plan_error():
        raise RuntimeError("cuDNN Frontend error: No execution plans support the graph.\nmore detail")
    with pytest.raises(Unsupported, match="cuDNN refused: cuDNN Frontend error: No execution plans support"):
        sdpa_module._cudnn_refusals(plan_error)

    def other():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        sdpa_module._cudnn_refusals(other)


def test_a_pinned_kernels_refusal_carries_torchs_reasons_every_time(monkeypatch):
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


def test_refusal_reasons_torch_writes_to_stderr_are_kept(monkeypatch, capfd):
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


def test_a_mixed_step_s_padding_rows_are_zero_whatever_the_kernel_leaves_there(monkeypatch):
    """A mixed serving step's padding rows see no key: the spec's answer is 0, which the math kernel gives (torch >=
    2.5) but a fused one need not (NaN, or the mean of V). On an H200 (torch 2.11, cuDNN 9.19, 2026-12-04) sdpa's own
    choice failed the mixed step that naive and flex passed with the same mask; the translation clears the rows."""
    from harness.calls.bound import backend_inputs
    from harness.cases.case import make_inputs
    from harness.cases.serving_step import CPU_MIX, serving_step

    case = serving_step(4, 32, "fp32", kv_heads=2, cache=20, page_size=None, mix=CPU_MIX)
    backend = get_backends(["sdpa"])[0]
    plan = backend.prepare(case, CPU)
    padding = case.mask.padding_rows(case.seq_q)
    assert plan.op.endswith("(padding rows cleared)") and padding.any() and not padding.all()
    q, k, v, _ = backend_inputs(backend, case, make_inputs(case, "cpu", 3), requires_grad=False)
    honest = backend.forward(q, k, v, mask=case.mask, scale=case.scale, prepared=plan)
    real_call = sdpa_module._Sdpa._call

    def fused(self, q, k, v, **kwargs):  # what a kernel may leave on a row that sees no key
        return real_call(self, q, k, v, **kwargs).masked_fill(padding[:, None, :, None], float("nan"))
    monkeypatch.setattr(sdpa_module._Sdpa, "_call", fused)
    out = backend.forward(q, k, v, mask=case.mask, scale=case.scale, prepared=plan)
    rows = padding[:, None, :, None].expand_as(out)
    assert torch.equal(out[rows], torch.zeros_like(out[rows])) and torch.equal(out[~rows], honest[~rows])
