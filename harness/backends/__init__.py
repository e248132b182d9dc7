"""Backends: the contract, the registry and one module per built-in backend; importing this registers them."""

from harness.backends.base import Backend, BackwardUnsupported, MaskForm, Unsupported
from harness.backends.registry import all_backends, get_backends, load_backend_module, register
from harness.backends import naive, sdpa, flex, xformers, flash_attn, flash_attn3, flash_attn4, flashinfer  # noqa: F401,E402  (registration)

__all__ = ["Backend", "BackwardUnsupported", "MaskForm", "Unsupported", "all_backends", "get_backends", "load_backend_module", "register"]
