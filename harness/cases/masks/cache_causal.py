"""Causal attention over KV caches of different lengths, each sequence's queries the last of its cache."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import torch

from harness.cases.masks.padding import PerSequenceLengths

#: sequences whose lengths the id lists one by one
ID_LENGTHS = 4


@dataclass(frozen=True)
class CacheCausal(PerSequenceLengths):
    """Query i of sequence b sees keys j <= lengths[b] - q_len[b] + i: its q_len[b] queries are the last entries of
    its cache of lengths[b] keys. `q_lens=None`: every sequence has seq_q queries; `q_lens=(...)`: a mixed serving
    step, seq_q the longest run, rows i >= q_lens[b] padding that sees no key (output 0)."""

    lengths: tuple[int, ...]
    q_lens: tuple[int, ...] | None = None

    kind = "cache-causal"
    min_length = 1

    def __post_init__(self):
        super().__post_init__()
        if self.q_lens is None:
            return
        q_lens = tuple(self.q_lens) if isinstance(self.q_lens, Sequence) else self.q_lens
        if not isinstance(q_lens, tuple) or len(q_lens) != len(self.lengths) or any(
                not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in q_lens):
            raise ValueError(f"CacheCausal.q_lens={self.q_lens!r}: must be one int >= 1 per sequence "
                             f"({len(self.lengths)}, as lengths)")
        if (b := next((b for b, (n, c) in enumerate(zip(q_lens, self.lengths)) if n > c), None)) is not None:
            raise ValueError(f"CacheCausal.q_lens={q_lens!r}: q_lens[{b}]={q_lens[b]} > lengths[{b}]="
                             f"{self.lengths[b]} (the queries are the last entries of their cache)")
        object.__setattr__(self, "q_lens", q_lens)

    @property
    def mixed(self) -> bool:
        return self.q_lens is not None

    @property
    def id(self) -> str:
        """'cache-causal37_20_5' ('...-q4_1_1' with q_lens); past ID_LENGTHS sequences: count, ranges and a digest."""
        if len(self.lengths) <= ID_LENGTHS:
            return self.spelled_id
        text = ",".join(map(str, self.lengths)) + ("" if self.q_lens is None else "/" + ",".join(map(str, self.q_lens)))
        digest = hashlib.sha1(text.encode()).hexdigest()[:8]
        q = "" if self.q_lens is None else f"-q{min(self.q_lens)}to{max(self.q_lens)}"
        return f"cache-causal{len(self.lengths)}x{min(self.lengths)}to{max(self.lengths)}{q}~{digest}"

    @property
    def spelled_id(self) -> str:
        """Every length listed, however many: 'cache-causal37_20_5_3_9-q4_1_1_1_1'."""
        q = "" if self.q_lens is None else "-q" + "_".join(str(n) for n in self.q_lens)
        return "cache-causal" + "_".join(str(n) for n in self.lengths) + q

    def validate_for(self, batch, seq_q, seq_k):
        super().validate_for(batch, seq_q, seq_k)
        if self.q_lens is not None and max(self.q_lens) != seq_q:
            raise ValueError(f"seq_q={seq_q}: a mixed step's seq_q is its longest query run, max(CacheCausal."
                             f"q_lens)={max(self.q_lens)}")
        if self.q_lens is None and min(self.lengths) < seq_q:
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

    def padding_rows(self, seq_q: int, device: str | torch.device = "cpu") -> torch.Tensor:
        """(batch, seq_q) bool: True on a mixed step's padding rows (i >= q_lens[b]), which see no key; all False
        when every sequence has seq_q queries."""
        return torch.arange(seq_q, device=device).view(1, -1) >= self.q_lens_tensor(seq_q, device).view(-1, 1)

    def key_ranges(self, seq_q, seq_k, batch=None):
        q_lens = self.q_lens_tensor(seq_q).view(-1, 1)
        rows = torch.arange(seq_q).view(1, -1)
        hi = self.lengths_tensor().view(-1, 1) - q_lens + rows + 1
        hi = hi.masked_fill(self.padding_rows(seq_q), 0)                     # padding rows: no key
        return torch.zeros_like(hi), hi.clamp(0, seq_k)


def cache_lengths(longest: int, batch: int) -> tuple[int, ...]:
    """Per-sequence cache lengths from `longest` down to about half of it, each odd (each last page is partial)."""
    lengths = (max(1, longest - (longest * b) // (2 * batch)) for b in range(batch))
    return tuple(n if n % 2 else n - 1 for n in lengths)
