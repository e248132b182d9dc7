"""The GPU paths on a real CUDA device: timing on the right device and stream, no host work inside timed calls,
graph capture of forward and backward, memory growth, the device index, and every installed backend's verdict.

Each test is the real-device counterpart of a CPU test with fakes (tests/unit/measure/test_cuda_paths.py,
tests/unit/backends/test_prepare_contract.py, test_xformers_dispatch.py)."""

from __future__ import annotations

import pytest
import torch

from harness import AttentionCase, check
from harness.backends.base import Unsupported
from harness.backends.registry import get_backends
from harness.calls.bound import BoundCall, backend_inputs
from harness.calls.round import TimedRound
from harness.measure.memory import peak_memory
from harness.measure.timing import TimingConfig, measure
from harness.cases.case import make_inputs
from harness.cases.masks import Causal, Documents, KeyPadding

pytestmark = pytest.mark.cuda
FAST = TimingConfig(warmup_ms=5, budget_ms=20, min_reps=5, max_reps=50)


def devices() -> list[str]:
    return [f"cuda:{i}" for i in range(min(torch.cuda.device_count(), 2))] if torch.cuda.is_available() else ["cuda:0"]


@pytest.mark.parametrize("name", devices())
def test_events_time_the_kernel_on_its_own_device(name):
    """A 4096^3 bf16 matmul takes ~0.1-1 ms on any recent GPU: events on the wrong device's stream would
    give ~0 (issue: GPU path, item 4)."""
    device = torch.device(name)
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    m = measure(lambda: a @ a, device=device, config=FAST)
    assert 0.02 < m.median < 50 and m.mode == "cuda-events"
    torch.cuda.synchronize(device)


def _available(names):
    out = []
    for b in get_backends(names):
        if not b.unavailable_reason(torch.device("cuda")):
            out.append(b)
    return out


@pytest.mark.parametrize("mask", [None, Causal(), KeyPadding((100, 256)), Documents((64, 128, 64))],
                         ids=["none", "causal", "keypad", "docs"])
def test_timed_calls_do_no_host_work(mask):
    """With sync debug mode 'error', any device->host sync (.item(), nonzero, a host copy) inside the timed call
    raises: everything case-dependent must have been prepared before (item 5)."""
    device = torch.device("cuda")
    case = AttentionCase(2, 8, 256, 64, "bf16", mask=mask)
    inputs = make_inputs(case, device)
    checked = []
    for backend in _available("all"):
        if not backend.supports(case, device):
            continue
        try:
            call = BoundCall(backend, case, device)
        except Unsupported:  # a pinned SDPA kernel refuses in prepare (sdpa-flash: no attn_mask; seen on an H200)
            continue
        q, k, v, _ = backend_inputs(backend, case, inputs, requires_grad=False)
        call(q, k, v)  # first call: compiles, warms up
        torch.cuda.synchronize(device)
        torch.cuda.set_sync_debug_mode("error")
        try:
            call(q, k, v)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        checked.append(backend.name)
    # not vacuous: naive and sdpa need nothing but torch, so a run that checked no backend checked nothing
    assert checked, f"no backend was checked on {case.id}"


@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_cuda_graph_captures_forward_and_backward(phase):
    """Capture on a side stream with the forward built there too (item 8)."""
    device = torch.device("cuda")
    case = AttentionCase(2, 8, 512, 64, "bf16", mask=Causal())
    backend = get_backends(["sdpa"])[0]
    inputs = make_inputs(case, device)
    graphed = TimedRound(backend, case, phase, device, inputs).capture(device)
    graphed.call()
    torch.cuda.synchronize(device)
    m = measure(graphed, device=device,
                config=TimingConfig(warmup_ms=5, budget_ms=20, min_reps=5, max_reps=50, cuda_graph=True))
    assert m.median > 0 and m.mode == "cuda-graph"


def test_memory_naive_grows_quadratically_fused_linearly():
    device = torch.device("cuda")
    peaks = {}
    for name in ("naive", "sdpa-flash"):
        backend = get_backends([name])[0]
        if backend.unavailable_reason(device):
            pytest.skip(f"{name}: {backend.unavailable_reason(device)}")
        for seq in (2048, 4096):
            case = AttentionCase(1, 16, seq, 128, "bf16", mask=Causal())
            p = TimedRound(backend, case, "fwd", device, make_inputs(case, device))
            peaks[name, seq] = peak_memory(p.call, device=device, setup=p.setup)[0]
    assert peaks["naive", 4096] / peaks["naive", 2048] > 3.0
    assert peaks["sdpa-flash", 4096] / peaks["sdpa-flash", 2048] < 2.6


def test_every_installed_backend_is_correct_on_a_small_gpu_slice():
    df = check("all", "gpu-smoke", "cuda")
    errors = df[df.status == "error"]
    assert errors.empty, errors[["backend", "case_id", "phase", "reason"]].to_string()
    # not vacuous: naive and sdpa need nothing but torch, so every one of their rows ran (a worker that could not
    # start once made all of them 'unavailable'); rows name the indexed device
    for name in ("naive", "sdpa"):
        ran = df[df.backend == name]
        assert len(ran) and ran.status.isin(["pass", "fail", "unsupported"]).all(), ran.status.value_counts()
        assert (ran.status == "pass").any()
    assert set(df.device) == {f"cuda:{torch.cuda.current_device()}"}
    xf = df[(df.backend == "xformers") & (df.status == "pass")]
    if len(xf):  # the op that ran is recorded per phase, forward and backward separately
        assert xf.backend_op.str.contains("F").any() and xf[xf.phase == "bwd"].backend_op.str.contains("B").all()


def test_a_second_device_is_used_when_named():
    if torch.cuda.device_count() < 2:
        pytest.skip("one CUDA device: cuda:1 needs two")
    df = check(["sdpa"], [AttentionCase(2, 8, 256, 64, "bf16", mask=Causal())], "cuda:1")
    assert set(df.status) == {"pass"} and set(df.device) == {"cuda:1"}
