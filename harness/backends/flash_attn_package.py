"""Whether the importable `flash_attn` is FlashAttention-2, found without importing it (that loads CUDA code)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

NOT_INSTALLED = "flash_attn is not installed"
#: the reason given when `flash_attn` is flash-attn-4's namespace package (flash_attn/cute/, no __init__.py)
FA4_NAMESPACE = "flash_attn is flash-attn-4's namespace, not FlashAttention-2"


def fa2_problem() -> str | None:
    """Why `flash_attn` is not FlashAttention-2 here, or None when its flash_attn_interface.py is there to import."""
    try:
        spec = importlib.util.find_spec("flash_attn")
    except (ImportError, ValueError) as exc:  # a broken parent or a module without a spec in sys.modules
        return f"flash_attn cannot be looked up: {type(exc).__name__}: {exc}"
    if spec is None:
        return NOT_INSTALLED
    locations = list(spec.submodule_search_locations or [])
    if any(Path(p, "flash_attn_interface.py").exists() for p in locations):
        return None
    if spec.origin in (None, "namespace"):  # a namespace package: no __init__.py in any of its folders
        names = sorted({p.name for loc in locations for p in Path(loc).iterdir() if not p.name.startswith("__")})
        return (f"{FA4_NAMESPACE} ({', '.join(locations)} holds {', '.join(names) or 'nothing'}, no "
                "flash_attn_interface)")
    return f"flash_attn at {spec.origin} has no flash_attn_interface module: it is not FlashAttention-2"
