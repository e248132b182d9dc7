"""What is tested: the case spec, mask and modifier specs and named case matrices."""

from harness.cases.modifiers import BIAS_KINDS, MODIFIERS, alibi_slopes

__all__ = ["BIAS_KINDS", "MODIFIERS", "alibi_slopes"]
