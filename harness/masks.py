"""The mask specs a user builds cases with (the public face of harness.cases.masks, where each family lives)."""

from harness.cases.masks import (MASK_NAMES, And, CacheCausal, Causal, CausalBottomRight, Documents, KeyPadding,
                                MaskSpec, SlidingWindow, parse_mask)

# the backends' and measurements' helpers (split_padding, count_attended_pairs) stay in harness.cases.masks
__all__ = ["MASK_NAMES", "And", "CacheCausal", "Causal", "CausalBottomRight", "Documents", "KeyPadding", "MaskSpec",
           "SlidingWindow", "parse_mask"]
