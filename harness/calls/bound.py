"""A backend bound to a case: its plan built once, the keywords the case implies, its inputs in the backend's layout."""

from __future__ import annotations

from typing import Protocol

import torch

from harness.backends.base import Backend
from harness.cases.case import AttentionCase, Inputs, make_inputs
from harness.cases.fp8 import kv_scales, per_query_head, q_scales, quantize
from harness.cases.modifiers import MODIFIER_GRADS, alibi_slopes
from harness.cases.paged import paged_inputs, paged_layout


class Arrangement(Protocol):
    """How inputs reach a backend (edge cases): views of the leaf tensors, and what happens to its output."""

    def inputs(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               layout: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def output(self, out: torch.Tensor) -> torch.Tensor: ...


class BoundCall:
    """`backend` on `case`, its plan built once (untimed); `__call__(q, k, v)` is only the kernel's work. leaves:
    sinks/bias (default: the seed-0 inputs', without gradients)."""

    def __init__(self, backend: Backend, case: AttentionCase, device: torch.device,
                 arrangement: Arrangement | None = None, leaves: dict[str, torch.Tensor] | None = None):
        self.backend, self.case, self.arrangement = backend, case, arrangement
        self.plan = backend.prepared_plan(case, device)
        if leaves is None:
            leaves = (modifier_leaves(make_inputs(case, device), requires_grad=False)
                      if set(MODIFIER_GRADS) & case.modifiers else {})
        self._kwargs = case_kwargs(case, device, leaves)
        if self.plan is not None:
            self._kwargs["prepared"] = self.plan

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.arrangement is not None:
            q, k, v = self.arrangement.inputs(q, k, v, self.backend.layout)
        out = self.backend.forward(q, k, v, mask=self.case.mask, scale=self.case.scale, **self._kwargs)
        return out if self.arrangement is None else self.arrangement.output(out)

    def ops(self, training: bool) -> tuple[str, str]:
        """(forward, backward) kernels the call runs with gradients or without (Backend.ops)."""
        return self.backend.ops(self.plan, training)


def modifier_leaves(inputs: Inputs, requires_grad: bool) -> dict[str, torch.Tensor]:
    """Fresh copies of the inputs' sinks and bias (those present), canonical layout whatever the backend's."""
    return {name: getattr(inputs, name).detach().clone().requires_grad_(requires_grad) for name in MODIFIER_GRADS
            if getattr(inputs, name) is not None}


def case_kwargs(case: AttentionCase, device: torch.device, leaves: dict[str, torch.Tensor]) -> dict:
    """forward's keywords `case` implies besides mask and scale: block_table, cache_seqlens, k_scale, v_scale,
    q_scale, softcap, alibi_slopes (heads,) float32, and the leaves (sinks, bias)."""
    kwargs: dict = {}
    if case.page_size is not None:
        layout = paged_layout(case, device)
        kwargs.update(block_table=layout.block_table, cache_seqlens=layout.cache_seqlens)
    if case.fp8_kv is not None:  # the case's FP8 cache scales, float32 on the device
        kwargs.update(zip(("k_scale", "v_scale"), (s.to(device) for s in kv_scales(case.kv_heads, case.fp8_kv))))
    if case.fp8_q:  # and q's, per tensor or per kv-head group
        kwargs["q_scale"] = q_scales(case.kv_heads, case.fp8_kv).to(device)
    if case.softcap is not None:
        kwargs["softcap"] = case.softcap
    if case.alibi:
        kwargs["alibi_slopes"] = alibi_slopes(case.heads).to(device)
    kwargs.update(leaves)
    return kwargs


def backend_inputs(backend: Backend, case: AttentionCase, inputs: Inputs, requires_grad: bool,
                   copy: bool = True) -> tuple[torch.Tensor, ...]:
    """Fresh contiguous copies of q, k, v, d_out in the backend's layout (paged: k_cache, v_cache). copy=False: the
    values alone, sharing `inputs`' memory where possible (what a timing round's refill copies from)."""
    if case.fp8_kv is not None:  # K and V as the FP8 cache holds them (canonical, quantized once, untimed)
        scales = kv_scales(case.kv_heads, case.fp8_kv)
        inputs = inputs._replace(k=quantize(inputs.k.detach(), scales[0]), v=quantize(inputs.v.detach(), scales[1]))
    if case.fp8_q:  # and q, each head with its group's scale
        inputs = inputs._replace(q=quantize(inputs.q.detach(), per_query_head(q_scales(case.kv_heads, case.fp8_kv),
                                                                              case.heads)))
    q, k, v, d_out = (backend.to_layout(t).detach().clone(memory_format=torch.contiguous_format) if copy
                      else backend.to_layout(t).detach().contiguous() for t in inputs[:4])
    if case.page_size is not None:
        k, v = paged_inputs(case, inputs.k.detach(), inputs.v.detach())[:2]
    if copy:
        for t in (q, k, v):
            t.requires_grad_(requires_grad)
    return q, k, v, d_out
