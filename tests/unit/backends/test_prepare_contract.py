"""The prepare contract: everything that depends only on (case, device) is built in `prepare`; the timed call does
only the kernel's work - no host-to-device copy, no synchronizing read, no mask building.

A TorchDispatchMode records the aten ops each call dispatches (torch 2.13, torch/utils/_python_dispatch.py). On a
GPU these would be syncs or copies: `_local_scalar_dense` (.item(), bool()), `nonzero` and boolean-mask indexing
(data-dependent shapes), `lift_fresh` (torch.tensor(host data)), a `_to_copy` to another device; `arange` and the
like are host-side mask building. flash_attn and xformers kernels do not run on the CPU: their library calls are
stubs here, so what is checked is the harness's own code around them."""

import sys
import types
from unittest import mock

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.backends.registry import get_backends
from harness.calls.bound import backend_inputs
from harness.cases.case import AttentionCase, make_inputs
from harness.cases.masks import Causal, CausalBottomRight, Documents, KeyPadding, SlidingWindow

CPU = torch.device("cpu")
#: ops that make host work or a host-device round trip inside a timed call (arange: the index grids masks are
#: built from; SDPA's math kernel building its own causal triangle is the kernel's work, not ours)
FORBIDDEN = {"_local_scalar_dense", "nonzero", "masked_select", "lift_fresh", "lift_fresh_copy", "arange",
             "_unique2", "item"}


class Spy(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name == "index" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                   for i in (args[1] if len(args) > 1 else []) if i is not None):
            name = "index(bool)"
        if name == "_to_copy" and "device" in (kwargs or {}) and kwargs["device"] != args[0].device:
            name = "_to_copy(other device)"
        self.seen.append(name)
        return func(*args, **(kwargs or {}))

    def forbidden(self) -> set[str]:
        return {n for n in self.seen if n in FORBIDDEN or n.endswith(")")}


MASKS = [None, Causal(), CausalBottomRight(), SlidingWindow(3, 0), KeyPadding((5, 9)), Causal() & KeyPadding((5, 9))]


def _call_under_spy(backend, case, prepared):
    q, k, v, _ = backend_inputs(backend, case, make_inputs(case), requires_grad=True)
    with Spy() as spy:
        out = backend.forward(q, k, v, mask=case.mask, scale=case.scale, prepared=prepared)
    return spy, out


@pytest.mark.parametrize("name", ["naive", "sdpa", "sdpa-math", "sdpa-flash", "flex"])
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "none" if m is None else m.id)
def test_cpu_backends_do_only_kernel_work_in_the_call(name, mask):
    backend = get_backends(name)[0]
    case = AttentionCase(2, 4, 9, 16, "fp32", mask=mask)
    prepared = backend.prepare(case, CPU)
    if name == "flex":  # compiled flex runs no aten ops in Python; the spy sees the eager call's own work
        with mock.patch("harness.backends.flex._compiled_flex", lambda: _eager_flex):
            spy, _ = _call_under_spy(backend, case, prepared)
    else:
        spy, _ = _call_under_spy(backend, case, prepared)
    assert not spy.forbidden(), spy.forbidden()


def _eager_flex(q, k, v, **kwargs):
    return torch.zeros_like(q)  # the mask work would show in building kwargs, which happened in prepare


def _fake_flash_attn():
    calls = []
    module = types.ModuleType("flash_attn")

    def flash_attn_func(q, k, v, **kwargs):
        calls.append(("dense", kwargs))
        return torch.zeros_like(q)

    def flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs):
        calls.append(("varlen", cu_q, cu_k, k.shape[0]))
        return torch.zeros_like(q)

    module.flash_attn_func, module.flash_attn_varlen_func, module.calls = flash_attn_func, flash_attn_varlen_func, calls
    return module


@pytest.mark.parametrize("mask", [Causal(), KeyPadding((5, 9)), SlidingWindow(3, 0), Documents((4, 0, 5))],
                         ids=lambda m: m.id)
def test_flash_attn_varlen_and_padding_need_no_host_work(mask):
    """The reviewed defect: cu_seqlens built with torch.tensor on every call and `k[keep]` (a boolean gather,
    which synchronizes) inside the timed region."""
    fake = _fake_flash_attn()
    backend = get_backends("flash-attn")[0]
    case = AttentionCase(2, 4, 9, 16, "fp16", mask=mask)
    with mock.patch.dict(sys.modules, {"flash_attn": fake, "flash_attn.flash_attn_interface": fake}):
        prepared = backend.prepare(case, CPU)
        spy, out = _call_under_spy(backend, case, prepared)
    assert not spy.forbidden(), spy.forbidden()
    assert out.shape == (2, 9, 4, 16)
    if isinstance(mask, KeyPadding):
        kind, cu_q, cu_k, kept = fake.calls[-1]
        assert kind == "varlen" and cu_k.tolist() == [0, 5, 14] and kept == 14 and cu_q.dtype == torch.int32


def test_xformers_call_builds_nothing():
    """The reviewed defect: a dense B x H x Sq x Sk bias built, and the dispatcher run twice, on every call."""
    from tests.unit.backends.test_xformers_dispatch import cuda_tensor, sm90
    from harness.backends.xformers import xformers_plan

    backend = get_backends("xformers")[0]
    for mask in (Causal() & KeyPadding((5, 9)), Causal(), Documents((4, 5))):
        case = AttentionCase(2, 8, 9, 16, "fp16", kv_heads=2, mask=mask)
        with sm90():
            plan = xformers_plan(case, CPU, cuda_tensor)
        seen = []

        def fake(q, k, v, attn_bias=None, scale=None, op=None):
            seen.append((tuple(q.shape), tuple(k.shape), op))
            return torch.zeros(*q.shape[:-1], v.shape[-1])

        with mock.patch("xformers.ops.memory_efficient_attention", fake), \
                mock.patch("xformers.ops.fmha.dispatch._dispatch_fw", side_effect=AssertionError("dispatched")):
            spy, out = _call_under_spy(backend, case, plan)
        assert not spy.forbidden(), (mask, spy.forbidden())
        assert seen[-1][2] == (plan.training.fw, plan.training.bw) and out.shape == (2, 9, 8, 16)
