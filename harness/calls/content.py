"""Each timed call's own inputs: windows of standard normal pools at offsets hashed from a seed the run's process
drew and a nonce it gave the call, made again there to judge it."""

from __future__ import annotations

import hashlib

import torch

from harness.calls.cache import LRU, cached
from harness.cases.case import AttentionCase, Inputs, input_shapes, shaped
from harness.store.schema import BWD, FWD

#: the Inputs fields a call of each phase reads anew: the forward alone reads no dO, the backward alone keeps the
#: graph its round built on q, k and v (and gets a new dO each call); a training step reads all four
RENEWED = {FWD: ("q", "k", "v"), BWD: ("d_out",)}
ALL_FOUR = ("q", "k", "v", "d_out")
#: each input's contents are windows of a standard normal pool of its n elements + max(n / OFFSET_SHARE, MIN_OFFSETS);
#: a call's input is the window at an offset of its own: one of at least MIN_OFFSETS an input, so a round of 200
#: calls repeats one input's window about once in three rounds, and q, k and v together never; a window costs a copy
#: into the buffers, not a draw (torch.randn: ~2.5 ns an element on this VM's CPU, 50x a copy)
MIN_OFFSETS = 1 << 16
OFFSET_SHARE = 8


def draw_pool(name: str, numel: int, device: torch.device | str) -> torch.Tensor:
    """The standard normal pool of input `name` of `numel` elements (+ its offsets) on `device`, float32, from a
    generator seeded by the two alone: what keeps a call's content unknown ahead is its offsets, hashed from the
    round's secret seed and the call's nonce; the pool is no secret - it lies in the worker's memory, where a kernel
    can read it from the round's start, drawn for that round or kept (calls.cache.POOL_BYTES)."""
    seed = int.from_bytes(hashlib.blake2b(f"pool/{name}/{numel}".encode(), digest_size=8).digest(), "little") >> 1
    return torch.randn(numel + offsets_of(numel), generator=torch.Generator().manual_seed(seed)).to(device)


def renewed(phase: str) -> tuple[str, ...]:
    """The Inputs fields a call of `phase` reads anew."""
    return RENEWED.get(phase, ALL_FOUR)


def offsets_of(numel: int) -> int:
    """How many offsets a window of `numel` elements has in its pool."""
    return max(numel // OFFSET_SHARE, MIN_OFFSETS)


class Contents:
    """A timed round's contents, all made from its `seed` (drawn by `secrets` in the run's process, which makes them
    again to judge a call: what the worker says it ran on is never believed), on `device`, with the verified inputs'
    sinks and bias. Each input of call i (0: the round's own, which the phase is built on - the backward alone's graph;
    i >= 1: a timed call's, for the inputs its phase renews; the rest stay the round's) is a window of that input's
    standard normal pool (`draw_pool`, kept in `pools` where given), at an offset hashed from (seed, i, the call's
    nonce, input), given the case's ranges (case.shaped) and cast. No content is a transform of another that a kernel
    could undo: a window at another offset moves every element, rarely by whole rows, and q, k and v each by its own
    offset, so no earlier answer, re-scaled or re-ordered, is a call's."""

    def __init__(self, case: AttentionCase, phase: str, seed: int, device: torch.device | str,
                 sinks: torch.Tensor | None = None, bias: torch.Tensor | None = None, pools: LRU | None = None):
        self.case, self.seed, self.renewed, self.device, self.pools = case, seed, renewed(phase), device, pools
        self.shapes = dict(zip(ALL_FOUR, input_shapes(case)))
        self.base = Inputs(None, None, None, None, sinks, bias)
        self.round = self._made(0, ALL_FOUR)

    def offset(self, index: int, name: str, nonce: int | None = None) -> int:
        """Where call `index` reads input `name`'s pool: a hash of (seed, index, the call's nonce, input), so either
        process finds it without replaying the round; the nonce comes from the run as the call before it is timed
        (isolation/brackets.py; None in a process of its own)."""
        digest = hashlib.blake2b(f"{self.seed}/{index}/{nonce}/{name}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % offsets_of(_numel(self.shapes[name]))

    def call(self, index: int, nonce: int | None = None, cast: bool = True) -> Inputs:
        """The inputs of the round's call `index` (0: the round's own) with its nonce, canonical, on the round's
        device, as the case's dtype - or, cast=False, the renewed ones still float32 (TimedRound.fresh casts them as it
        copies them into the buffers: one copy of each, not two)."""
        return self.round if index == 0 else self._made(index, self.renewed, nonce, cast)

    def _made(self, index: int, names: tuple[str, ...], nonce: int | None = None, cast: bool = True) -> Inputs:
        windows = [self._window(name, self.offset(index, name, nonce)) if name in names else None
                   for name in ALL_FOUR]
        made = {name: t.to(self.case.dtype) if cast else t
                for name, t in zip(ALL_FOUR, shaped(self.case, windows)) if t is not None}
        return (self.base if index == 0 else self.round)._replace(**made)

    def _window(self, name: str, offset: int) -> torch.Tensor:
        numel = _numel(self.shapes[name])
        drawn = cached(self.pools, (name, numel, str(self.device)), lambda: draw_pool(name, numel, self.device))
        return drawn[offset:offset + numel].view(self.shapes[name])


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n
