"""Causal attention over KV caches of different lengths: each sequence's queries are the last ones of its own cache."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from harness.spec.masks.padding import PerSequenceLengths

#: sequences whose lengths the id lists one by one
ID_LENGTHS = 4


@dataclass(frozen=True)
class CacheCausal(PerSequenceLengths):
    """Query i of sequence b sees keys j <= lengths[b] - seq_q + i: the seq_q queries (one decode token, or the
    2-8 tokens speculative decoding verifies) are the last entries of sequence b's cache of lengths[b] keys.

    `CausalBottomRight() & KeyPadding(lengths)` aligns every sequence to seq_k instead, which is wrong for all
    but the longest cache once seq_q > 1."""

    lengths: tuple[int, ...]

    kind = "cache-causal"
    per_batch = True
    min_length = 1

    def __post_init__(self):
        self._check_lengths()

    @property
    def id(self) -> str:
        """'cache-causal37_20_5'; past ID_LENGTHS sequences their count, range and a digest of all of them (a batch
        of 64 caches would make a 400-character case id)."""
        if len(self.lengths) <= ID_LENGTHS:
            return "cache-causal" + "_".join(str(n) for n in self.lengths)
        digest = hashlib.sha1(",".join(map(str, self.lengths)).encode()).hexdigest()[:8]
        return f"cache-causal{len(self.lengths)}x{min(self.lengths)}to{max(self.lengths)}~{digest}"

    def validate_for(self, batch, seq_q, seq_k):
        self._check_batch(batch, seq_k)
        if min(self.lengths) < seq_q:
            raise ValueError(f"CacheCausal.lengths={self.lengths!r}: each must be >= seq_q={seq_q} (the queries are "
                             "the last entries of their cache)")

    def predicate(self, device="cpu"):
        lengths = self.lengths_tensor(device)
        return lambda b, q_idx, k_idx, seq_q, seq_k: k_idx <= lengths[b] - seq_q + q_idx

    def key_ranges(self, seq_q, seq_k, batch=None):
        hi = self.lengths_tensor().view(-1, 1) - seq_q + torch.arange(seq_q).view(1, -1) + 1
        return torch.zeros_like(hi), hi.clamp(0, seq_k)
