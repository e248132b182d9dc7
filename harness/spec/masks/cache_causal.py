"""Causal attention over KV caches of different lengths: each sequence's queries are the last ones of its own cache;
with per-sequence query lengths, one mixed serving step (prefill chunks, decodes, verifications in one batch)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import torch

from harness.spec.masks.padding import PerSequenceLengths

#: sequences whose lengths the id lists one by one
ID_LENGTHS = 4


@dataclass(frozen=True)
class CacheCausal(PerSequenceLengths):
    """Query i of sequence b sees keys j <= lengths[b] - q_len[b] + i: the q_len[b] queries (one decode token, the
    2-8 tokens speculative decoding verifies, or a chunk of a prefill) are the last entries of sequence b's cache of
    lengths[b] keys.

    `q_lens=None`: every sequence has seq_q queries. `q_lens=(...)`: a mixed serving step, sequence b has q_lens[b]
    queries (1 <= q_lens[b] <= lengths[b]) and the case's seq_q is the longest of them; query rows i >= q_lens[b]
    are padding that sees no key (their output is 0, the harness's rule for a row without keys).

    `CausalBottomRight() & KeyPadding(lengths)` aligns every sequence to seq_k instead, which is wrong for all
    but the longest cache once seq_q > 1."""

    lengths: tuple[int, ...]
    q_lens: tuple[int, ...] | None = None

    kind = "cache-causal"
    per_batch = True
    min_length = 1

    def __post_init__(self):
        self._check_lengths()
        if self.q_lens is None:
            return
        q_lens = tuple(self.q_lens) if isinstance(self.q_lens, Sequence) else self.q_lens
        if not isinstance(q_lens, tuple) or len(q_lens) != len(self.lengths) or any(
                not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in q_lens):
            raise ValueError(f"CacheCausal.q_lens={self.q_lens!r}: must be one int >= 1 per sequence "
                             f"({len(self.lengths)}, as lengths)")
        over = [b for b, (n, c) in enumerate(zip(q_lens, self.lengths)) if n > c]
        if over:
            b = over[0]
            raise ValueError(f"CacheCausal.q_lens={q_lens!r}: q_lens[{b}]={q_lens[b]} > lengths[{b}]="
                             f"{self.lengths[b]} (the queries are the last entries of their cache)")
        object.__setattr__(self, "q_lens", q_lens)

    @property
    def mixed(self) -> bool:
        """Whether the sequences have their own query lengths (a mixed serving step)."""
        return self.q_lens is not None

    @property
    def id(self) -> str:
        """'cache-causal37_20_5', with query lengths 'cache-causal37_20_5-q4_1_1'; past ID_LENGTHS sequences their
        count, ranges and a digest of all of them (a batch of 64 caches would make a 400-character case id)."""
        if len(self.lengths) <= ID_LENGTHS:
            q = "" if self.q_lens is None else "-q" + "_".join(str(n) for n in self.q_lens)
            return "cache-causal" + "_".join(str(n) for n in self.lengths) + q
        text = ",".join(map(str, self.lengths)) + ("" if self.q_lens is None else "/" + ",".join(map(str, self.q_lens)))
        digest = hashlib.sha1(text.encode()).hexdigest()[:8]
        q = "" if self.q_lens is None else f"-q{min(self.q_lens)}to{max(self.q_lens)}"
        return f"cache-causal{len(self.lengths)}x{min(self.lengths)}to{max(self.lengths)}{q}~{digest}"

    def validate_for(self, batch, seq_q, seq_k):
        self._check_batch(batch, seq_k)
        if self.q_lens is not None:
            if max(self.q_lens) != seq_q:
                raise ValueError(f"seq_q={seq_q}: a mixed step's seq_q is its longest query run, max(CacheCausal."
                                 f"q_lens)={max(self.q_lens)}")
        elif min(self.lengths) < seq_q:
            raise ValueError(f"CacheCausal.lengths={self.lengths!r}: each must be >= seq_q={seq_q} (the queries are "
                             "the last entries of their cache)")

    def q_lens_tensor(self, seq_q: int, device: str | torch.device = "cpu") -> torch.Tensor:
        """Each sequence's query count (batch,) int64: q_lens, or seq_q for all."""
        q_lens = self.q_lens if self.q_lens is not None else (seq_q,) * len(self.lengths)
        return torch.tensor(q_lens, device=device, dtype=torch.int64)

    def predicate(self, device="cpu"):
        lengths = self.lengths_tensor(device)
        if self.q_lens is None:
            return lambda b, q_idx, k_idx, seq_q, seq_k: k_idx <= lengths[b] - seq_q + q_idx
        q_lens = torch.tensor(self.q_lens, device=device, dtype=torch.int64)
        return lambda b, q_idx, k_idx, seq_q, seq_k: (k_idx <= lengths[b] - q_lens[b] + q_idx) & (q_idx < q_lens[b])

    def key_ranges(self, seq_q, seq_k, batch=None):
        q_lens = self.q_lens_tensor(seq_q).view(-1, 1)
        rows = torch.arange(seq_q).view(1, -1)
        hi = self.lengths_tensor().view(-1, 1) - q_lens + rows + 1
        hi = hi.masked_fill(rows >= q_lens, 0)                               # padding rows: no key
        return torch.zeros_like(hi), hi.clamp(0, seq_k)
