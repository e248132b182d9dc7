"""Each timed call's own inputs: fresh normal draws from a seed the run's process drew, made again there to judge it."""

from __future__ import annotations

import hashlib

import torch

from harness.cases.case import AttentionCase, Inputs, input_shapes, shaped
from harness.store.schema import BWD, FWD

#: the Inputs fields a call of each phase reads anew: the forward alone reads no dO, the backward alone keeps the
#: graph its round built on q, k and v (and gets a new dO each call); a training step reads all four
RENEWED = {FWD: ("q", "k", "v"), BWD: ("d_out",)}
ALL_FOUR = ("q", "k", "v", "d_out")
#: each input has a standard normal pool of its n elements + max(n / OFFSET_SHARE, MIN_OFFSETS); a call's input is a
#: window of it at an offset of its own: one of at least MIN_OFFSETS an input, so a round of 200 calls repeats one
#: input's window about once in three rounds, and q, k and v together never; a window costs a copy into the buffers,
#: not a draw (torch.randn: ~2.5 ns an element on this VM's CPU, 50x a copy); the pools cost ~1.1 draws of each input
#: a round
MIN_OFFSETS = 1 << 16
OFFSET_SHARE = 8


def renewed(phase: str) -> tuple[str, ...]:
    """The Inputs fields a call of `phase` reads anew."""
    return RENEWED.get(phase, ALL_FOUR)


def offsets_of(numel: int) -> int:
    """How many offsets a window of `numel` elements has in its pool."""
    return max(numel // OFFSET_SHARE, MIN_OFFSETS)


class Contents:
    """A timed round's contents, all made from its `seed` (drawn by `secrets` in the run's process, which makes them
    again to judge a call: what the worker says it ran on is never believed), on `device`, with the verified inputs'
    sinks and bias. Each input of call i (0: the round's own, which the phase is built on - the backward alone's
    graph; i >= 1: a timed call's, for the inputs its phase renews; the rest stay the round's) is a window of the
    round's standard normal pool of that input, at an offset hashed from (seed, i, the call's nonce, input), given
    the case's ranges (case.shaped) and cast. No content is a transform of another that a kernel could undo: a window
    at another offset moves every element, rarely by whole rows, and q, k and v each by its own offset, so no earlier
    answer, re-scaled or re-ordered, is a call's."""

    def __init__(self, case: AttentionCase, phase: str, seed: int, device: torch.device | str,
                 sinks: torch.Tensor | None = None, bias: torch.Tensor | None = None):
        self.case, self.seed, self.renewed = case, seed, renewed(phase)
        self.shapes = dict(zip(ALL_FOUR, input_shapes(case)))
        generator = torch.Generator().manual_seed(seed)
        self.pools = {name: torch.randn(_numel(shape) + offsets_of(_numel(shape)), generator=generator).to(device)
                      for name, shape in self.shapes.items()}
        self.base = Inputs(None, None, None, None, sinks, bias)
        self.round = self._made(0, ALL_FOUR)

    def offset(self, index: int, name: str, nonce: int | None = None) -> int:
        """Where call `index` reads input `name`'s pool: a hash of (seed, index, the call's nonce, input), so either
        process finds it without replaying the round; the nonce comes from the run as the call before it is timed
        (isolation/brackets.py; None in a process of its own)."""
        digest = hashlib.blake2b(f"{self.seed}/{index}/{nonce}/{name}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % offsets_of(_numel(self.shapes[name]))

    def call(self, index: int, nonce: int | None = None) -> Inputs:
        """The inputs of the round's call `index` (0: the round's own) with its nonce, canonical, on the round's
        device, as the case's dtype."""
        return self.round if index == 0 else self._made(index, self.renewed, nonce)

    def _made(self, index: int, names: tuple[str, ...], nonce: int | None = None) -> Inputs:
        windows = [self._window(name, self.offset(index, name, nonce)) if name in names else None
                   for name in ALL_FOUR]
        made = {name: t.to(self.case.dtype) for name, t in zip(ALL_FOUR, shaped(self.case, windows)) if t is not None}
        return (self.base if index == 0 else self.round)._replace(**made)

    def _window(self, name: str, offset: int) -> torch.Tensor:
        return self.pools[name][offset:offset + _numel(self.shapes[name])].view(self.shapes[name])


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n
