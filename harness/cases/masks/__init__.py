"""Mask specs, one family per module; every name a user or backend needs is importable from here."""

from harness.cases.masks.base import And, MaskSpec, count_attended_pairs
from harness.cases.masks.cache_causal import CacheCausal
from harness.cases.masks.causal import Causal, CausalBottomRight
from harness.cases.masks.documents import Documents
from harness.cases.masks.names import MASK_NAMES, parse_mask
from harness.cases.masks.padding import KeyPadding, split_padding
from harness.cases.masks.window import SlidingWindow

__all__ = ["MASK_NAMES", "And", "CacheCausal", "Causal", "CausalBottomRight", "Documents", "KeyPadding", "MaskSpec",
           "SlidingWindow", "count_attended_pairs", "parse_mask", "split_padding"]
