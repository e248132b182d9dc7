"""The mask contract: a small frozen object that says which (query, key) pairs may attend, and materializes itself.

Convention everywhere: a boolean mask where True means "this query may attend this key".
Every mask is defined once, by `allows(b, q_idx, k_idx, seq_q, seq_k)` written in plain torch ops on
index tensors; `materialize()` evaluates it on a grid, and backends that take a predicate (flex) call it
directly, so the semantics are never re-derived anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def key_ranges(self, seq_q: int, seq_k: int, batch: int | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Where every query row's visible keys form one interval: (lo, hi) int64 tensors of shape (B|1, seq_q),
        row i seeing keys lo <= j < hi (hi <= lo: none). None where a mask's rows are not intervals. A shortcut
        for counting at long sequences (O(seq_q), not O(seq_q x seq_k)); tests hold it equal to `allows`."""
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

    def key_ranges(self, seq_q, seq_k, batch=None):
        first, second = self.first.key_ranges(seq_q, seq_k, batch), self.second.key_ranges(seq_q, seq_k, batch)
        if first is None or second is None:
            return None
        return torch.maximum(first[0], second[0]), torch.minimum(first[1], second[1])  # intervals intersect


def count_attended_pairs(mask: MaskSpec | None, batch: int, seq_q: int, seq_k: int, block: int = 1024) -> int:
    """Exact number of (batch, query, key) pairs attended, for FLOP counts: from the rows' key intervals where
    the mask has them, else from the materialized mask in chunks so memory stays small."""
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
