"""Key padding: each batch element sees only its first `lengths[b]` keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from harness.spec.masks.base import MaskSpec


@dataclass(frozen=True)
class KeyPadding(MaskSpec):
    """Per-batch valid key lengths: batch element b sees keys j < lengths[b] (right padding)."""

    lengths: tuple[int, ...]

    kind = "keypad"
    per_batch = True

    def __post_init__(self):
        lengths = tuple(self.lengths) if isinstance(self.lengths, Sequence) else self.lengths
        if not isinstance(lengths, tuple) or not lengths or any(
                not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in lengths):
            raise ValueError(f"KeyPadding.lengths={self.lengths!r}: must be a non-empty sequence of ints >= 0")
        object.__setattr__(self, "lengths", lengths)

    @property
    def id(self) -> str:
        return "keypad" + "_".join(str(n) for n in self.lengths)

    def validate_for(self, batch, seq_q, seq_k):
        if len(self.lengths) != batch:
            raise ValueError(f"KeyPadding.lengths={self.lengths!r} has {len(self.lengths)} entries; batch is {batch}")
        if max(self.lengths) > seq_k:
            raise ValueError(f"KeyPadding.lengths={self.lengths!r}: each must be <= seq_k={seq_k}")

    def batch_size(self, batch):
        return len(self.lengths)

    def lengths_tensor(self, device: str | torch.device = "cpu") -> torch.Tensor:
        return torch.tensor(self.lengths, device=device, dtype=torch.int64)

    def predicate(self, device="cpu"):
        lengths = self.lengths_tensor(device)
        return lambda b, q_idx, k_idx, seq_q, seq_k: k_idx < lengths[b]

    def allows(self, b, q_idx, k_idx, seq_q, seq_k):
        return self.predicate(k_idx.device)(b, q_idx, k_idx, seq_q, seq_k)

    def key_ranges(self, seq_q, seq_k, batch=None):
        hi = self.lengths_tensor().view(-1, 1).expand(-1, seq_q)
        return torch.zeros_like(hi), hi
