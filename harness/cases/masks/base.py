"""The mask contract: a frozen spec of which (query, key) pairs may attend (True = attend), defined by `allows`."""

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
    #: why two masks of this family cannot be intersected (what to do instead); '' = they can
    single_in_and: str = ""

    def allows(self, b: torch.Tensor, q_idx: torch.Tensor, k_idx: torch.Tensor, seq_q: int, seq_k: int) -> torch.Tensor:
        """Elementwise predicate on broadcastable index tensors (True = may attend); defined here or by predicate."""
        if type(self).predicate is MaskSpec.predicate:
            raise NotImplementedError
        return self.predicate(k_idx.device)(b, q_idx, k_idx, seq_q, seq_k)

    def predicate(self, device: str | torch.device = "cpu"):
        """`allows` with its tensors built on `device` (traced code such as flex's mask_mod must not create any)."""
        return self.allows

    @property
    def id(self) -> str:
        return self.kind

    @property
    def spelled_id(self) -> str:
        """The id with every number spelled out (no digest): what harness.cases.case_id parses back to this mask."""
        return self.id

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
        return self.predicate(device)(b, q, k, seq_q, seq_k).expand(nb, 1, stop - start, seq_k)

    def batch_size(self, batch: int | None) -> int:
        return 1

    def key_ranges(self, seq_q: int, seq_k: int, batch: int | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Each row's visible keys as one interval lo <= j < hi: int64 (B|1, seq_q) tensors; None if not intervals."""
        return None

    def __and__(self, other: "MaskSpec") -> "MaskSpec":
        return And(self, other)


@dataclass(frozen=True)
class And(MaskSpec):
    """Intersection of two masks, e.g. Causal() & KeyPadding((5, 9))."""

    first: MaskSpec
    second: MaskSpec

    def __post_init__(self):
        for m in (self.first, self.second):
            if not isinstance(m, MaskSpec):
                raise ValueError(f"And({m!r}): both parts must be mask specs")
        family = type(self.first)
        if family is type(self.second) and self.first.single_in_and:
            raise ValueError(f"And({family.__name__}, {family.__name__}): {self.first.single_in_and}")

    @property
    def kind(self) -> str:  # type: ignore[override]
        return f"{self.first.kind}+{self.second.kind}"

    @property
    def per_batch(self) -> bool:  # type: ignore[override]
        return self.first.per_batch or self.second.per_batch

    @property
    def id(self) -> str:
        return f"{self.first.id}+{self.second.id}"

    @property
    def spelled_id(self) -> str:
        return f"{self.first.spelled_id}+{self.second.spelled_id}"

    def parts(self) -> tuple[MaskSpec, ...]:
        return tuple(p for m in (self.first, self.second) for p in (m.parts() if isinstance(m, And) else (m,)))

    def validate_for(self, batch, seq_q, seq_k):
        self.first.validate_for(batch, seq_q, seq_k)
        self.second.validate_for(batch, seq_q, seq_k)

    def batch_size(self, batch):
        return max(self.first.batch_size(batch), self.second.batch_size(batch))

    def predicate(self, device="cpu"):
        first, second = self.first.predicate(device), self.second.predicate(device)
        return lambda *idx: first(*idx) & second(*idx)

    def key_ranges(self, seq_q, seq_k, batch=None):
        first, second = self.first.key_ranges(seq_q, seq_k, batch), self.second.key_ranges(seq_q, seq_k, batch)
        if first is None or second is None:
            return None
        return torch.maximum(first[0], second[0]), torch.minimum(first[1], second[1])  # intervals intersect


def int_tuple(label: str, value: object, least: int) -> tuple[int, ...]:
    """`value` as a non-empty tuple of ints >= `least`; a ValueError naming `label` otherwise."""
    lengths = tuple(value) if isinstance(value, Sequence) else value
    if not isinstance(lengths, tuple) or not lengths or any(
            not isinstance(n, int) or isinstance(n, bool) or n < least for n in lengths):
        raise ValueError(f"{label}={value!r}: must be a non-empty sequence of ints >= {least}")
    return lengths


def count_attended_pairs(mask: MaskSpec | None, batch: int, seq_q: int, seq_k: int, block: int = 1024) -> int:
    """Exact number of (batch, query, key) pairs attended (FLOP counts): from key_ranges, else in chunks of rows."""
    if mask is None:
        return batch * seq_q * seq_k
    ranges = mask.key_ranges(seq_q, seq_k, batch)
    if ranges is not None:
        lo, hi = ranges
        return int((hi - lo).clamp_min(0).sum()) * (batch if lo.shape[0] == 1 else 1)
    total = 0
    for start in range(0, seq_q, block):
        rows = mask.materialize(seq_q, seq_k, batch=batch, rows=(start, min(seq_q, start + block)))
        total += int(rows.sum()) * (batch if rows.shape[0] == 1 else 1)
    return total
