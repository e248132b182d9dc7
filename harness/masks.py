"""The mask specs a user builds cases with (the public face of harness.spec.masks, where each family lives)."""

from harness.spec.masks import (MASK_NAMES, And, CacheCausal, Causal, CausalBottomRight, Documents, KeyPadding,
                                MaskSpec, SlidingWindow, parse_mask)

# the backends' and measurements' helpers (split_padding, count_attended_pairs) stay in harness.spec.masks
__all__ = ["MASK_NAMES", "And", "CacheCausal", "Causal", "CausalBottomRight", "Documents", "KeyPadding", "MaskSpec",
           "SlidingWindow", "parse_mask"]
