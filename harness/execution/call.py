"""A backend bound to one case: its `prepare` done once (untimed), then the call that alone is timed."""

from __future__ import annotations

from typing import Protocol

import torch

from harness.backends.base import Backend
from harness.spec.case import AttentionCase, Inputs


class Arrangement(Protocol):
    """How inputs reach a backend (edge cases): views of the leaf tensors, and what happens to its output."""

    def inputs(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               layout: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def output(self, out: torch.Tensor) -> torch.Tensor: ...


class BoundCall:
    """`backend` on `case`: prepared state built at construction, `__call__(q, k, v)` runs only the kernel's work."""

    def __init__(self, backend: Backend, case: AttentionCase, device: torch.device,
                 arrangement: Arrangement | None = None):
        self.backend, self.case, self.arrangement = backend, case, arrangement
        state = backend.prepare(case, device)
        self._kwargs = {} if state is None else {"prepared": state}

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.arrangement is not None:
            q, k, v = self.arrangement.inputs(q, k, v, self.backend.layout)
        out = self.backend.forward(q, k, v, mask=self.case.mask, scale=self.case.scale, **self._kwargs)
        return out if self.arrangement is None else self.arrangement.output(out)


def backend_inputs(backend: Backend, inputs: Inputs, requires_grad: bool) -> tuple[torch.Tensor, ...]:
    """Fresh copies of q, k, v, d_out in the backend's native layout (contiguous), outside any timing."""
    q, k, v, d_out = (backend.to_layout(t).detach().clone(memory_format=torch.contiguous_format) for t in inputs)
    return q.requires_grad_(requires_grad), k.requires_grad_(requires_grad), v.requires_grad_(requires_grad), d_out
