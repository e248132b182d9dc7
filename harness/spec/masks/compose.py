"""Composing masks: the intersection of two specs, and splitting a spec into its structural and padding parts."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.spec.masks.base import MaskSpec
from harness.spec.masks.padding import KeyPadding


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

    def key_ranges(self, seq_q, seq_k, batch=None):
        first, second = self.first.key_ranges(seq_q, seq_k, batch), self.second.key_ranges(seq_q, seq_k, batch)
        if first is None or second is None:
            return None
        return torch.maximum(first[0], second[0]), torch.minimum(first[1], second[1])  # intervals intersect


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
