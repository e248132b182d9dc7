"""Mask specs: small frozen objects named for their exact semantics, each able to materialize itself.

Convention everywhere: a boolean mask where True means "this query may attend this key".
Every mask is defined once, by `allows(b, q_idx, k_idx, seq_q, seq_k)` written in plain torch ops on
index tensors; `materialize()` evaluates it on a grid, and backends that take a predicate (flex) call it
directly, so the semantics are never re-derived anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


class MaskSpec:
    """Base class; subclasses are frozen dataclasses."""

    #: short name used in case ids, CSV and plots
    kind: str = "mask"
    #: True when the mask differs per batch element (materialize then has a batch dim)
    per_batch: bool = False

    def allows(self, b: torch.Tensor, q_idx: torch.Tensor, k_idx: torch.Tensor, seq_q: int, seq_k: int) -> torch.Tensor:
        """Elementwise predicate on broadcastable index tensors. True = query q_idx may attend k_idx."""
        raise NotImplementedError

    def predicate(self, device: str | torch.device = "cpu"):
        """`allows` with any tensors it needs already built on `device` (traced code such as flex's
        mask_mod must not create tensors itself)."""
        return self.allows

    @property
    def id(self) -> str:
        return self.kind

    def validate_for(self, batch: int, seq_q: int, seq_k: int) -> None:
        """Raise ValueError when this mask cannot apply to a case of this shape."""

    def materialize(self, seq_q: int, seq_k: int, device: str | torch.device = "cpu", *, batch: int | None = None,
                    rows: tuple[int, int] | None = None) -> torch.Tensor:
        """Dense bool mask of shape (B or 1, 1, seq_q, seq_k); `rows=(start, stop)` gives only those query rows."""
        start, stop = rows if rows is not None else (0, seq_q)
        nb = self.batch_size(batch)
        b = torch.arange(nb, device=device).view(nb, 1, 1, 1)
        q = torch.arange(start, stop, device=device).view(1, 1, -1, 1)
        k = torch.arange(seq_k, device=device).view(1, 1, 1, -1)
        out = self.predicate(device)(b, q, k, seq_q, seq_k)
        return out.expand(nb, 1, stop - start, seq_k)

    def batch_size(self, batch: int | None) -> int:
        return 1

    def __and__(self, other: "MaskSpec") -> "MaskSpec":
        return And(self, other)


@dataclass(frozen=True)
class Causal(MaskSpec):
    """Top-left aligned causal: query i sees keys j <= i (SDPA is_causal, xformers LowerTriangularMask)."""

    kind = "causal"

    def allows(self, b, q_idx, k_idx, seq_q, seq_k):
        return k_idx <= q_idx


@dataclass(frozen=True)
class CausalBottomRight(MaskSpec):
    """Bottom-right aligned causal: query i sees keys j <= i + seq_k - seq_q (FlashAttention-2 >= 2.1)."""

    kind = "causal-br"

    def allows(self, b, q_idx, k_idx, seq_q, seq_k):
        return k_idx <= q_idx + (seq_k - seq_q)


@dataclass(frozen=True)
class SlidingWindow(MaskSpec):
    """Bottom-right aligned local window, FlashAttention-2 semantics.

    Query i sees keys j with i + seq_k - seq_q - left <= j <= i + seq_k - seq_q + right;
    left/right = -1 means unbounded on that side. SlidingWindow(left, 0) is causal-bottom-right
    attention limited to the last left + 1 keys.
    """

    left: int
    right: int = 0

    kind = "window"

    def __post_init__(self):
        for side in ("left", "right"):
            value = getattr(self, side)
            if not isinstance(value, int) or isinstance(value, bool) or value < -1:
                raise ValueError(f"SlidingWindow.{side}={value!r}: must be an int >= 0, or -1 for unbounded")

    @property
    def id(self) -> str:
        return f"window{self.left}-{self.right}"

    def allows(self, b, q_idx, k_idx, seq_q, seq_k):
        diag = q_idx + (seq_k - seq_q)
        ok = torch.ones_like(k_idx <= diag)
        if self.left >= 0:
            ok = ok & (k_idx >= diag - self.left)
        if self.right >= 0:
            ok = ok & (k_idx <= diag + self.right)
        return ok


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


@dataclass(frozen=True)
class And(MaskSpec):
    """Intersection of two masks, e.g. Causal() & KeyPadding((5, 9))."""

    first: MaskSpec
    second: MaskSpec

    def __post_init__(self):
        for m in (self.first, self.second):
            if not isinstance(m, MaskSpec):
                raise ValueError(f"And({m!r}): both parts must be mask specs")
        if isinstance(self.first, KeyPadding) and isinstance(self.second, KeyPadding):
            raise ValueError("And(KeyPadding, KeyPadding): combine the lengths into one KeyPadding instead")

    @property
    def kind(self) -> str:  # type: ignore[override]
        return f"{self.first.kind}+{self.second.kind}"

    @property
    def per_batch(self) -> bool:  # type: ignore[override]
        return self.first.per_batch or self.second.per_batch

    @property
    def id(self) -> str:
        return f"{self.first.id}+{self.second.id}"

    def parts(self) -> tuple[MaskSpec, ...]:
        out: list[MaskSpec] = []
        for m in (self.first, self.second):
            out.extend(m.parts() if isinstance(m, And) else (m,))
        return tuple(out)

    def validate_for(self, batch, seq_q, seq_k):
        self.first.validate_for(batch, seq_q, seq_k)
        self.second.validate_for(batch, seq_q, seq_k)

    def batch_size(self, batch):
        return max(self.first.batch_size(batch), self.second.batch_size(batch))

    def predicate(self, device="cpu"):
        first, second = self.first.predicate(device), self.second.predicate(device)
        return lambda *idx: first(*idx) & second(*idx)

    def allows(self, b, q_idx, k_idx, seq_q, seq_k):
        return self.predicate(k_idx.device)(b, q_idx, k_idx, seq_q, seq_k)


@dataclass(frozen=True)
class Documents(MaskSpec):
    """Packed documents (block-diagonal), the same packing in every batch element.

    Document d holds queries [q_start[d], q_end[d]) and keys [k_start[d], k_end[d]), laid out back to back
    from `q_lengths` and `k_lengths` (default: equal to q_lengths). Query i sees key j only when both lie
    in the same document; with causal=True also j <= i + (k_end[d] - q_end[d]), i.e. causal aligned
    bottom-right within each document (FA2 varlen; plain causal when a document has as many queries as
    keys). Zero-length documents are allowed; a document with queries but no keys gives empty rows.
    """

    q_lengths: tuple[int, ...]
    k_lengths: tuple[int, ...] | None = None
    causal: bool = False

    kind = "docs"

    def __post_init__(self):
        for name in ("q_lengths", "k_lengths"):
            value = getattr(self, name)
            if value is None:
                continue
            lengths = tuple(value) if isinstance(value, Sequence) else value
            if not isinstance(lengths, tuple) or not lengths or any(
                    not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in lengths):
                raise ValueError(f"Documents.{name}={value!r}: must be a non-empty sequence of ints >= 0")
            object.__setattr__(self, name, lengths)
        if self.k_lengths is None:
            object.__setattr__(self, "k_lengths", self.q_lengths)
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
        return ("docs-causal" if self.causal else "docs") + docs

    def validate_for(self, batch, seq_q, seq_k):
        if sum(self.q_lengths) != seq_q or sum(self.k_lengths) != seq_k:
            raise ValueError(f"Documents q_lengths={self.q_lengths!r} / k_lengths={self.k_lengths!r} sum to "
                             f"{sum(self.q_lengths)} / {sum(self.k_lengths)}; the case has seq_q={seq_q}, "
                             f"seq_k={seq_k}")

    def starts(self, which: str) -> tuple[int, ...]:
        """Offsets (0, end of doc 0, ...) of 'q' or 'k' documents: FA2's cu_seqlens for one batch element."""
        if which not in ("q", "k"):
            raise ValueError(f"which={which!r}; allowed: q, k")
        out = [0]
        for n in (self.q_lengths if which == "q" else self.k_lengths):
            out.append(out[-1] + n)
        return tuple(out)

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

    def allows(self, b, q_idx, k_idx, seq_q, seq_k):
        return self.predicate(k_idx.device)(b, q_idx, k_idx, seq_q, seq_k)


def split_padding(mask: MaskSpec | None) -> tuple[MaskSpec | None, KeyPadding | None]:
    """Split a mask into (structural part, key padding part); backends use it to map each part natively."""
    if mask is None or isinstance(mask, KeyPadding):
        return None, mask
    if isinstance(mask, And):
        parts = mask.parts()
        pads = [p for p in parts if isinstance(p, KeyPadding)]
        rest = [p for p in parts if not isinstance(p, KeyPadding)]
        structural: MaskSpec | None = None
        for p in rest:
            structural = p if structural is None else And(structural, p)
        return structural, (pads[0] if pads else None)
    return mask, None


def count_attended_pairs(mask: MaskSpec | None, batch: int, seq_q: int, seq_k: int, block: int = 1024) -> int:
    """Exact number of (batch, query, key) pairs attended, for FLOP counts; chunked so memory stays small."""
    if mask is None:
        return batch * seq_q * seq_k
    total = 0
    for start in range(0, seq_q, block):
        rows = mask.materialize(seq_q, seq_k, batch=batch, rows=(start, min(seq_q, start + block)))
        total += int(rows.sum()) * (batch if rows.shape[0] == 1 else 1)
    return total


MASK_NAMES = ("none", "causal", "causal-br", "window", "keypad", "causal+keypad")


def parse_mask(name: str, *, batch: int, seq_k: int) -> MaskSpec | None:
    """Build a mask from a short CLI/matrix name; window and padding get shape-derived defaults."""
    if name == "none":
        return None
    if name == "causal":
        return Causal()
    if name == "causal-br":
        return CausalBottomRight()
    if name == "window":
        return SlidingWindow(max(1, seq_k // 4), 0)
    if name in ("keypad", "causal+keypad"):
        # Deterministic, varied lengths: the last batch element keeps every key, others lose some.
        lengths = tuple(max(1, seq_k - (seq_k * (batch - 1 - b)) // (2 * batch)) for b in range(batch))
        pad = KeyPadding(lengths)
        return pad if name == "keypad" else And(Causal(), pad)
    raise ValueError(f"unknown mask {name!r}; allowed: {', '.join(MASK_NAMES)}")
