"""A correct backend made slower on purpose, to check that `harness compare` flags real slowdowns.

`sdpa-math-tunable` is SDPA's math kernel with two knobs read from the environment at each call, so one
backend name (the compare key) can be run at different speeds:

- HARNESS_REPEAT=N (default 1): do the whole attention N times (forward and backward really do N x the work).
- HARNESS_SLOWDOWN=F (default 0): after the forward, and after the backward, spin for F x the time the
  real work just took: a slowdown of 1 + F that is exact whatever the case size, to find the smallest
  slowdown compare detects.

Outputs equal plain sdpa-math (exactly for N <= 2: the mean of two identical tensors is the tensor), so the
correctness verdict is unchanged and the run is timed.
"""

from __future__ import annotations

import os
import time

import torch

from harness import register
from harness.backends.sdpa import SdpaMath


def _knobs() -> tuple[int, float]:
    repeat, slowdown = os.environ.get("HARNESS_REPEAT", "1"), os.environ.get("HARNESS_SLOWDOWN", "0")
    try:
        n, f = int(repeat), float(slowdown)
    except ValueError:
        raise ValueError(f"HARNESS_REPEAT={repeat!r}, HARNESS_SLOWDOWN={slowdown!r}: expected an int >= 1 and a "
                         "float >= 0") from None
    if n < 1 or f < 0:
        raise ValueError(f"HARNESS_REPEAT={n}, HARNESS_SLOWDOWN={f}: expected an int >= 1 and a float >= 0")
    return n, f


def _spin(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:  # busy, like work: a sleep would free the core and time differently
        pass


class _BackwardStart(torch.autograd.Function):
    """Identity on the output; its backward runs first in the backward pass and notes the time."""

    @staticmethod
    def forward(ctx, out, clock):
        ctx.clock = clock
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        ctx.clock["t0"] = time.perf_counter()
        return grad, None


class _BackwardEnd(torch.autograd.Function):
    """Identity on q, k, v; its backward runs last and spins for F x the backward time since the start."""

    @staticmethod
    def forward(ctx, clock, slowdown, q, k, v):
        ctx.clock, ctx.slowdown = clock, slowdown
        return q.view_as(q), k.view_as(k), v.view_as(v)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        if "t0" in ctx.clock:  # backward may reach q, k and v in one call; spin once
            _spin(ctx.slowdown * (time.perf_counter() - ctx.clock.pop("t0")))
        return None, None, dq, dk, dv


@register
class TunableSdpaMath(SdpaMath):
    name = "sdpa-math-tunable"

    def forward(self, q, k, v, *, mask, scale):
        repeat, slowdown = _knobs()
        clock: dict = {}
        if slowdown and torch.is_grad_enabled() and q.requires_grad:
            q, k, v = _BackwardEnd.apply(clock, slowdown, q, k, v)
        start = time.perf_counter()
        outs = [super(TunableSdpaMath, self).forward(q, k, v, mask=mask, scale=scale) for _ in range(repeat)]
        out = outs[0] if repeat == 1 else torch.stack(outs).mean(0).to(outs[0].dtype)
        _spin(slowdown * (time.perf_counter() - start))
        if slowdown and out.requires_grad:
            out = _BackwardStart.apply(out, clock)
        return out
