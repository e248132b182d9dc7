"""Built-in backends; importing this package registers each of them."""

from harness.backends.base import Backend, Unsupported, all_backends, get_backends, load_backend_module, register
from harness.backends import naive, sdpa, flex, xformers, flash_attn  # noqa: F401,E402  (registration)

__all__ = ["Backend", "Unsupported", "all_backends", "get_backends", "load_backend_module", "register"]
