"""Backends: the contract, the registry and one module per built-in backend (registry.BUILT_IN)."""

from harness.backends.base import Backend, BackwardUnsupported, MaskForm, Unsupported
from harness.backends.registry import all_backends, get_backends, register

__all__ = ["Backend", "BackwardUnsupported", "MaskForm", "Unsupported", "all_backends", "get_backends", "register"]
