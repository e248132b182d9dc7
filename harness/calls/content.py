"""Each timed call's own inputs: fresh normal draws from a seed the run's process drew, made again there to judge a call."""

from __future__ import annotations

import hashlib

import torch

from harness.cases.case import AttentionCase, Inputs, input_shapes, make_inputs, shaped
from harness.store.schema import BWD, FWD

#: the Inputs fields a call of each phase reads anew: the forward alone reads no dO, the backward alone keeps the
#: graph its round built on q, k and v (and gets a new dO each call); a training step reads all four
RENEWED = {FWD: ("q", "k", "v"), BWD: ("d_out",)}
ALL_FOUR = ("q", "k", "v", "d_out")
#: each renewed input has two standard normal pools of its elements + OFFSETS(n) each; a call's input is the sum of a
#: window of each, at two offsets of its own, over sqrt(2) (standard normal again): one of at least MIN_OFFSETS^2
#: contents an input, so a round of 1,000 calls repeats an input's content once in ~30 rounds (one pool's offsets
#: alone repeated ~100 times a round on a small case), at the cost of an add, not a draw (torch.randn: ~2.5 ns an
#: element on this VM's CPU, 50x a copy)
MIN_OFFSETS = 4096


def offsets_of(numel: int) -> int:
    """How many offsets a window of `numel` elements has in its pool."""
    return max(numel, MIN_OFFSETS)


class Contents:
    """A timed round's contents, all made from its `seed` (drawn by `secrets` in the run's process, which makes
    them again to judge a call: what the worker says it ran on is never believed). Call 0 is the round's own inputs,
    make_inputs(case, device, seed) - the backward alone's graph is built on them; call i >= 1 reads, for each input
    its phase renews, the scaled sum of two windows of the round's two standard normal pools of that input, at
    offsets hashed from (seed, i, input), given the case's ranges (case.shaped) and cast; the rest are the round's.
    No content is a transform of another: two windows' sum shares no element with another pair's (each window moves
    by its own offset), so no earlier answer, re-scaled or re-ordered, is a call's."""

    def __init__(self, case: AttentionCase, phase: str, seed: int, device: torch.device | str = "cpu"):
        self.case, self.seed, self.device = case, seed, torch.device(device)
        self.round = make_inputs(case, self.device, seed)
        self.renewed = RENEWED.get(phase, ALL_FOUR)
        shapes = dict(zip(ALL_FOUR, input_shapes(case)))
        self.shapes = {name: shapes[name] for name in self.renewed}
        generator = torch.Generator().manual_seed(seed ^ 0x5DEECE66D)   # not make_inputs' stream
        self.pools = {name: [torch.randn(_numel(shape) + offsets_of(_numel(shape)), generator=generator).to(
            self.device) for _ in range(2)] for name, shape in self.shapes.items()}

    def offsets(self, index: int) -> dict[str, tuple[int, int]]:
        """Where call `index` reads each renewed input's two pools: a hash of (seed, index, input), so either process
        finds it without replaying the round."""
        found = {}
        for name, shape in self.shapes.items():
            digest = hashlib.blake2b(f"{self.seed}/{index}/{name}".encode(), digest_size=16).digest()
            span = offsets_of(_numel(shape))
            found[name] = (int.from_bytes(digest[:8], "little") % span, int.from_bytes(digest[8:], "little") % span)
        return found

    def call(self, index: int) -> Inputs:
        """The inputs of the round's call `index` (0: the round's own), canonical, on the round's device, as the
        case's dtype."""
        if index == 0:
            return self.round
        offsets = self.offsets(index)
        windows = [self._window(name, offsets[name]) if name in self.pools else None for name in ALL_FOUR]
        made = shaped(self.case, windows)
        return self.round._replace(**{name: t.to(self.case.dtype) for name, t in zip(ALL_FOUR, made)
                                      if t is not None})


    def _window(self, name: str, offsets: tuple[int, int]) -> torch.Tensor:
        n, (a, b) = _numel(self.shapes[name]), self.pools[name]
        return torch.add(a[offsets[0]:offsets[0] + n], b[offsets[1]:offsets[1] + n]).mul_(SQRT_HALF).view(
            self.shapes[name])


SQRT_HALF = 0.5 ** 0.5


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n
