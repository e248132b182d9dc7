"""Old import path of the case spec (now harness.spec.case), kept for code that imports harness.case."""

from harness.spec.case import DTYPES, AttentionCase, Inputs, dtype_name, make_inputs, parse_dtype  # noqa: F401

__all__ = ["DTYPES", "AttentionCase", "Inputs", "dtype_name", "make_inputs", "parse_dtype"]
