"""Packed documents: a block-diagonal mask, optionally causal within each document (varlen attention)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch

from harness.cases.masks.base import MaskSpec, int_tuple


@dataclass(frozen=True)
class Documents(MaskSpec):
    """Packed documents (block-diagonal), the same packing in every batch element, laid out back to back from
    `q_lengths` and `k_lengths` (default: q_lengths; zero-length allowed). Query i sees key j of its own document;
    with causal=True only j <= i + (k_end[d] - q_end[d]): bottom-right within each document (FA2 varlen)."""

    q_lengths: tuple[int, ...]
    k_lengths: tuple[int, ...] | None = None
    causal: bool = False

    @property
    def kind(self) -> str:  # type: ignore[override]
        return "docs-causal" if self.causal else "docs"

    def __post_init__(self):
        object.__setattr__(self, "q_lengths", int_tuple("Documents.q_lengths", self.q_lengths, 0))
        object.__setattr__(self, "k_lengths", self.q_lengths if self.k_lengths is None
                           else int_tuple("Documents.k_lengths", self.k_lengths, 0))
        if len(self.k_lengths) != len(self.q_lengths):
            raise ValueError(f"Documents: q_lengths={self.q_lengths!r} and k_lengths={self.k_lengths!r} "
                             "must list the same number of documents")
        if not isinstance(self.causal, bool):
            raise ValueError(f"Documents.causal={self.causal!r}: must be True or False")

    @property
    def id(self) -> str:
        docs = "_".join(str(n) for n in self.q_lengths)
        if self.k_lengths != self.q_lengths:
            docs += "x" + "_".join(str(n) for n in self.k_lengths)
        return self.kind + docs

    def validate_for(self, batch, seq_q, seq_k):
        if sum(self.q_lengths) != seq_q or sum(self.k_lengths) != seq_k:
            raise ValueError(f"Documents q_lengths={self.q_lengths!r} / k_lengths={self.k_lengths!r} sum to "
                             f"{sum(self.q_lengths)} / {sum(self.k_lengths)}; the case has seq_q={seq_q}, "
                             f"seq_k={seq_k}")

    def starts(self, which: str) -> tuple[int, ...]:
        """Offsets (0, end of doc 0, ...) of 'q' or 'k' documents: FA2's cu_seqlens for one batch element."""
        if which not in ("q", "k"):
            raise ValueError(f"which={which!r}; allowed: q, k")
        return (0, *accumulate(self.q_lengths if which == "q" else self.k_lengths))

    def predicate(self, device="cpu"):
        # Per-position lookup tables, built once: the document of each query and key, and each query's
        # bottom-right causal shift k_end[d] - q_end[d]. Indexing them is traceable inside flex's mask_mod.
        docs = torch.arange(len(self.q_lengths), device=device)
        q_len = torch.tensor(self.q_lengths, device=device)
        q_doc = torch.repeat_interleave(docs, q_len)
        k_doc = torch.repeat_interleave(docs, torch.tensor(self.k_lengths, device=device))
        ends = torch.tensor(self.starts("k")[1:], device=device) - torch.tensor(self.starts("q")[1:], device=device)
        shift = torch.repeat_interleave(ends, q_len)
        n_q, n_k, causal = len(q_doc), len(k_doc), self.causal

        def allows(b, q_idx, k_idx, seq_q, seq_k):
            if (seq_q, seq_k) != (n_q, n_k):
                raise ValueError(f"Documents cover {n_q} queries x {n_k} keys; asked for {seq_q} x {seq_k}")
            same = q_doc[q_idx] == k_doc[k_idx]
            return same & (k_idx <= q_idx + shift[q_idx]) if causal else same

        return allows

    def key_ranges(self, seq_q, seq_k, batch=None):
        self.validate_for(1, seq_q, seq_k)
        q_len = torch.tensor(self.q_lengths)
        k_starts, q_starts = torch.tensor(self.starts("k")), torch.tensor(self.starts("q"))
        lo = torch.repeat_interleave(k_starts[:-1], q_len)                  # each query's document's keys
        hi = torch.repeat_interleave(k_starts[1:], q_len)
        if self.causal:  # bottom-right within the document: j <= i + (k_end - q_end)
            shift = torch.repeat_interleave(k_starts[1:] - q_starts[1:], q_len)
            hi = torch.minimum(hi, torch.arange(seq_q) + shift + 1)
        return lo.view(1, -1), hi.view(1, -1)
