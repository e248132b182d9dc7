"""The registry every built-in and user backend goes through: register, look up by name, load a plugin module."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from harness.backends.base import LAYOUTS, Backend

_REGISTRY: dict[str, Backend] = {}


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator: validate and add a backend to the registry (a later one of the same name replaces it)."""
    if not isinstance(cls, type) or not issubclass(cls, Backend):
        raise TypeError(f"register({cls!r}): expects a harness.Backend subclass")
    if not cls.name or not isinstance(cls.name, str):
        raise ValueError(f"backend class {cls.__name__} needs a non-empty string `name`")
    if cls.layout not in LAYOUTS:
        raise ValueError(f"backend {cls.name!r}: layout={cls.layout!r}; allowed: {', '.join(LAYOUTS)}")
    _REGISTRY[cls.name] = cls()
    return cls


def _load_builtins() -> None:
    import harness.backends  # noqa: F401  (imports every built-in module, which register themselves)


def all_backends() -> dict[str, Backend]:
    _load_builtins()
    return dict(_REGISTRY)


def get_backends(names: list[str] | str | None = None) -> list[Backend]:
    """Backends by name ('a,b' or a list); None/'all' = every registered one. Unknown names are a ValueError."""
    registry = all_backends()
    if names is None or names == "all" or names == ["all"]:
        return list(registry.values())
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ValueError(f"unknown backend {', '.join(map(repr, unknown))}; allowed: {', '.join(registry)}")
    return [registry[n] for n in names]


def load_backend_module(spec: str) -> Any:
    """Import a user module (a dotted name or a .py path) so its @register decorators run."""
    try:
        if spec.endswith(".py") or "/" in spec or Path(spec).exists():
            path = Path(spec)
            if not path.is_file():
                raise ValueError(f"--backend-module {spec!r}: no such file")
            mod_name = f"harness_user_{path.stem}"
            loader = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(loader)
            sys.modules[mod_name] = module
            loader.loader.exec_module(module)
            return module
        return importlib.import_module(spec)
    except ValueError:
        raise
    except Exception as exc:  # the user's import error, reduced to one line that names the module
        raise ValueError(f"--backend-module {spec!r} failed to import: {type(exc).__name__}: {exc}") from exc
