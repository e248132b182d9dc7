"""Key padding: each batch element sees only its first `lengths[b]` keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from harness.spec.masks.base import MaskSpec


class PerSequenceLengths(MaskSpec):
    """A mask made of one length per batch element (`lengths`): their checks, batch size and tensor, defined once."""

    lengths: tuple[int, ...]
    #: the least length allowed
    min_length: int = 0

    def _check_lengths(self) -> None:
        lengths = tuple(self.lengths) if isinstance(self.lengths, Sequence) else self.lengths
        if not isinstance(lengths, tuple) or not lengths or any(
                not isinstance(n, int) or isinstance(n, bool) or n < self.min_length for n in lengths):
            raise ValueError(f"{type(self).__name__}.lengths={self.lengths!r}: must be a non-empty sequence of ints "
                             f">= {self.min_length}")
        object.__setattr__(self, "lengths", lengths)

    def _check_batch(self, batch: int, seq_k: int) -> None:
        name = type(self).__name__
        if len(self.lengths) != batch:
            raise ValueError(f"{name}.lengths={self.lengths!r} has {len(self.lengths)} entries; batch is {batch}")
        if max(self.lengths) > seq_k:
            raise ValueError(f"{name}.lengths={self.lengths!r}: each must be <= seq_k={seq_k}")

    def batch_size(self, batch):
        return len(self.lengths)

    def lengths_tensor(self, device: str | torch.device = "cpu") -> torch.Tensor:
        return torch.tensor(self.lengths, device=device, dtype=torch.int64)

    def allows(self, b, q_idx, k_idx, seq_q, seq_k):
        return self.predicate(k_idx.device)(b, q_idx, k_idx, seq_q, seq_k)


@dataclass(frozen=True)
class KeyPadding(PerSequenceLengths):
    """Per-batch valid key lengths: batch element b sees keys j < lengths[b] (right padding)."""

    lengths: tuple[int, ...]

    kind = "keypad"
    per_batch = True
    single_in_and = "combine the lengths into one KeyPadding instead"

    def __post_init__(self):
        self._check_lengths()

    @property
    def id(self) -> str:
        return "keypad" + "_".join(str(n) for n in self.lengths)

    def validate_for(self, batch, seq_q, seq_k):
        self._check_batch(batch, seq_k)

    def predicate(self, device="cpu"):
        lengths = self.lengths_tensor(device)
        return lambda b, q_idx, k_idx, seq_q, seq_k: k_idx < lengths[b]

    def key_ranges(self, seq_q, seq_k, batch=None):
        hi = self.lengths_tensor().view(-1, 1).expand(-1, seq_q)
        return torch.zeros_like(hi), hi
