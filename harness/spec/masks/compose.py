"""Splitting a mask spec into its structural and padding parts (the intersection itself, And, is the contract's)."""

from __future__ import annotations

from harness.spec.masks.base import And, MaskSpec
from harness.spec.masks.padding import KeyPadding


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
