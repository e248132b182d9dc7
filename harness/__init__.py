"""Attention harness: check and benchmark attention backends against an exact float64 reference."""

from __future__ import annotations

import importlib

#: the public names and the module each comes from, imported on first use (PEP 562): `python -m harness` with a bad
#: argument is refused before torch is imported (issue 67: 12-22 s to say "no such file" under load)
_PUBLIC = {"check": "harness.api", "Backend": "harness.backends.base", "BackwardUnsupported": "harness.backends.base",
           "Plan": "harness.backends.base", "Unsupported": "harness.backends.base",
           "all_backends": "harness.backends.registry", "get_backends": "harness.backends.registry",
           "load_backend_module": "harness.isolation.plugin_host", "register": "harness.backends.registry",
           "reference_attention": "harness.oracle.reference", "AttentionCase": "harness.cases.case",
           "Inputs": "harness.cases.case", "make_inputs": "harness.cases.case", "Causal": "harness.masks",
           "CausalBottomRight": "harness.masks", "KeyPadding": "harness.masks", "SlidingWindow": "harness.masks",
           "load_results": "harness.store.load"}
_SUBMODULES = ("masks", "recommend")

__all__ = sorted([*_PUBLIC, *_SUBMODULES])


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"harness.{name}")
    if name not in _PUBLIC:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC, *_SUBMODULES])
