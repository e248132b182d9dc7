"""The registry every built-in and user backend goes through: register, look up by name, load a plugin module."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from harness.backends.base import Backend
from harness.backends.declaration import declaration_problems, where

_REGISTRY: dict[str, Backend] = {}
#: plugin modules loaded so far (absolute .py paths or dotted names), so worker processes can load them too
_LOADED: list[str] = []


def register(cls: type[Backend] | None = None, *, replace: bool = False):
    """Class decorator (`@register`, or `@register(replace=True)`): validate and add a backend to the registry.

    A name already taken by another class is an error - a plugin would otherwise silently take the place of a
    built-in (and replacing naive would move every tolerance) - unless the plugin says replace=True. The same
    class registered again (its module imported twice) just replaces itself. The declaration (name, layout,
    capability attributes, `forward`'s signature) is checked first: a bad one is a ValueError naming the backend,
    its file and every problem (backends/declaration.py).
    """
    if cls is None:
        return lambda c: register(c, replace=replace)
    if not isinstance(cls, type) or not issubclass(cls, Backend):
        raise TypeError(f"register({cls!r}): expects a harness.Backend subclass")
    problems = declaration_problems(cls)
    if problems:  # once, when the plugin loads, instead of a TypeError row per case
        label = repr(cls.name) if isinstance(cls.name, str) and cls.name else cls.__qualname__
        raise ValueError(f"backend {label} ({cls.__qualname__} in {where(cls)}): {'; '.join(problems)}")
    current = _REGISTRY.get(cls.name)
    if current is not None and not replace and _identity(type(current)) != _identity(cls):
        owner = type(current)
        what = ("a built-in backend" if owner.__module__.startswith("harness.backends.")
                else f"{owner.__module__}.{owner.__qualname__}")
        raise ValueError(f"backend name {cls.name!r} is taken by {what}; give {cls.__qualname__} another name, or "
                         "register it with @register(replace=True) to replace that one")
    _REGISTRY[cls.name] = cls()
    return cls


def _identity(cls: type) -> tuple[str, str]:
    return cls.__module__, cls.__qualname__


def _remember(spec: str) -> None:
    if spec not in _LOADED:
        _LOADED.append(spec)


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
    if not names:
        raise ValueError(f"no backend named; give one or more of: {', '.join(registry)} (or 'all')")
    unknown = [n for n in names if n not in registry]
    if unknown:
        # a name that is no built-in is most often the user's own backend, whose module was not loaded
        raise ValueError(f"unknown backend {', '.join(map(repr, unknown))}; allowed: {', '.join(registry)}; a "
                         "backend of your own is known once its module is loaded: --backend-module my_attn.py")
    return [registry[n] for n in names]


def loaded_modules() -> tuple[str, ...]:
    """The plugin modules loaded in this process, in order (a worker process loads the same)."""
    return tuple(_LOADED)


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
            _remember(str(path.resolve()))  # absolute: a worker may start elsewhere
            return module
        module = importlib.import_module(spec)
        _remember(spec)
        return module
    except ValueError:
        raise
    except SystemExit as exc:  # sys.exit() at import: not an Exception, and would end the command without a word
        sys.modules.pop(f"harness_user_{Path(spec).stem}", None)
        raise ValueError(f"--backend-module {spec!r} called sys.exit({exc.code!r}) while being imported; a backend "
                         "module may only define and register backends") from None
    except Exception as exc:  # the user's import error, reduced to one line that names the module
        raise ValueError(f"--backend-module {spec!r} failed to import: {type(exc).__name__}: {exc}") from exc
