"""Key padding: each batch element sees only its first `lengths[b]` keys; splitting it off a mask."""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

import torch

from harness.cases.masks.base import And, MaskSpec, int_tuple


class PerSequenceLengths(MaskSpec):
    """A mask made of one length per batch element (`lengths`): their checks, batch size and tensor, defined once."""

    lengths: tuple[int, ...]
    #: the least length allowed
    min_length: int = 0
    per_batch = True

    def __post_init__(self):
        object.__setattr__(self, "lengths", int_tuple(f"{type(self).__name__}.lengths", self.lengths, self.min_length))

    def validate_for(self, batch, seq_q, seq_k):
        name = type(self).__name__
        if len(self.lengths) != batch:
            raise ValueError(f"{name}.lengths={self.lengths!r} has {len(self.lengths)} entries; batch is {batch}")
        if max(self.lengths) > seq_k:
            raise ValueError(f"{name}.lengths={self.lengths!r}: each must be <= seq_k={seq_k}")

    def batch_size(self, batch):
        return len(self.lengths)

    def lengths_tensor(self, device: str | torch.device = "cpu") -> torch.Tensor:
        return torch.tensor(self.lengths, device=device, dtype=torch.int64)


@dataclass(frozen=True)
class KeyPadding(PerSequenceLengths):
    """Per-batch valid key lengths: batch element b sees keys j < lengths[b] (right padding)."""

    lengths: tuple[int, ...]

    kind = "keypad"
    single_in_and = "combine the lengths into one KeyPadding instead"

    @property
    def id(self) -> str:
        return "keypad" + "_".join(str(n) for n in self.lengths)

    def predicate(self, device="cpu"):
        lengths = self.lengths_tensor(device)
        return lambda b, q_idx, k_idx, seq_q, seq_k: k_idx < lengths[b]

    def key_ranges(self, seq_q, seq_k, batch=None):
        hi = self.lengths_tensor().view(-1, 1).expand(-1, seq_q)
        return torch.zeros_like(hi), hi


def split_padding(mask: MaskSpec | None) -> tuple[MaskSpec | None, KeyPadding | None]:
    """Split a mask into (structural part, key padding part); backends use it to map each part natively."""
    if mask is None or isinstance(mask, KeyPadding):
        return None, mask
    if isinstance(mask, And):
        parts = mask.parts()
        pads = [p for p in parts if isinstance(p, KeyPadding)]
        rest = [p for p in parts if not isinstance(p, KeyPadding)]
        return (reduce(And, rest) if rest else None), (pads[0] if pads else None)
    return mask, None
