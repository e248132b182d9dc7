"""Mask specs, one family per module; every name a user or backend needs is importable from here."""

from harness.spec.masks.base import And, MaskSpec, count_attended_pairs
from harness.spec.masks.cache_causal import CacheCausal
from harness.spec.masks.causal import Causal, CausalBottomRight
from harness.spec.masks.documents import Documents
from harness.spec.masks.names import MASK_NAMES, parse_mask
from harness.spec.masks.padding import KeyPadding, split_padding
from harness.spec.masks.window import SlidingWindow

__all__ = ["MASK_NAMES", "And", "CacheCausal", "Causal", "CausalBottomRight", "Documents", "KeyPadding", "MaskSpec",
           "SlidingWindow", "count_attended_pairs", "parse_mask", "split_padding"]
