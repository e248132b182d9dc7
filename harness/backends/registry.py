"""The registry every built-in and user backend goes through: register, look up by name, import a plugin module."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from harness.backends.base import Backend
from harness.backends.declaration import declaration_problems, where

#: the built-in backends, one module each under harness/backends/, loaded by name on the first lookup: the one line
#: a new built-in backend adds here. Their error rows are the harness's own (the GPU acceptance run counts them).
BUILT_IN = tuple(f"harness.backends.{module}" for module in
                 ("naive", "sdpa", "flex", "xformers", "flash_attn", "flash_attn3", "flash_attn4", "flashinfer"))

_REGISTRY: dict[str, Backend] = {}
#: plugin modules loaded so far (absolute .py paths or dotted names, in order), here or declared from their own process
_LOADED: list[str] = []
#: backend name -> the plugin module that registered it: the one module its worker imports (none for a built-in)
_ORIGIN: dict[str, str] = {}
#: backend names registered with replace=True (a plugin's stand-in replaces as the plugin's class did)
_REPLACED: set[str] = set()
#: the plugin module being imported in this process (its @register calls note it as their origin)
_IMPORTING: list[str] = []


def register(cls: type[Backend] | None = None, *, replace: bool = False):
    """Class decorator (`@register`, or `@register(replace=True)`): validate and add a backend to the registry.

    A bad declaration (backends/declaration.py) is a ValueError naming the backend, its file and every problem. A
    name taken by another class is an error unless replace=True (a plugin would otherwise silently take a built-in's
    place, and replacing naive would move every tolerance); the same class registered again just replaces itself."""
    if cls is None:
        return lambda c: register(c, replace=replace)
    if not isinstance(cls, type) or not issubclass(cls, Backend):
        raise TypeError(f"register({cls!r}): expects a harness.Backend subclass")
    problems = declaration_problems(cls)
    if problems:  # once, when the plugin loads, instead of a TypeError row per case
        label = repr(cls.name) if isinstance(cls.name, str) and cls.name else cls.__qualname__
        raise ValueError(f"backend {label} ({cls.__qualname__} in {where(cls)}): {'; '.join(problems)}")
    add(cls(), replace=replace, origin=_IMPORTING[-1] if _IMPORTING else None)
    return cls


def add(backend: Backend, *, replace: bool = False, origin: str | None = None) -> None:
    """Put a validated backend (or a plugin's stand-in, isolation/plugin_host.py) in the registry under its name;
    `origin`: the plugin module it came from. A name taken by another class is a ValueError unless `replace`."""
    cls = type(backend)
    if cls.__module__ not in BUILT_IN:
        all_backends()  # the built-ins first, so a plugin registered before any lookup cannot take one's name
    current = _REGISTRY.get(cls.name)
    owner = type(current) if current is not None else cls
    if not replace and (owner.__module__, owner.__qualname__) != (cls.__module__, cls.__qualname__):
        what = ("a built-in backend" if owner.__module__.startswith("harness.backends.")
                else f"{owner.__module__}.{owner.__qualname__}")
        raise ValueError(f"backend name {cls.name!r} is taken by {what}; give {cls.__qualname__} another name, or "
                         "register it with @register(replace=True) to replace that one")
    _REGISTRY[cls.name] = backend
    (_REPLACED.add if replace else _REPLACED.discard)(cls.name)
    if origin is None:
        _ORIGIN.pop(cls.name, None)
    else:
        _ORIGIN[cls.name] = origin


def all_backends() -> dict[str, Backend]:
    """Every registered backend by name: the built-ins in BUILT_IN's order (naive first), then plugins as registered."""
    for module in BUILT_IN:  # by name: each module imports this one to register itself
        importlib.import_module(module)
    rank = {module: i for i, module in enumerate(BUILT_IN)}
    return dict(sorted(_REGISTRY.items(), key=lambda item: rank.get(type(item[1]).__module__, len(BUILT_IN))))


def built_in_names() -> tuple[str, ...]:
    """The registered backends whose module is one of BUILT_IN (a plugin's errors are the plugin's)."""
    return tuple(name for name, backend in all_backends().items() if type(backend).__module__ in BUILT_IN)


def versioned_backends() -> dict[str, Backend]:
    """env.json's name of every library version the registered backends record -> the first backend recording it
    (torch's backends record none: torch's version is the platform's)."""
    found: dict[str, Backend] = {}
    for backend in all_backends().values():
        key = backend.version_key()
        if key is not None:
            found.setdefault(key, backend)
    return found


def label(name: str) -> str:
    """How the report and figures name backend `name`: its declared label, else the name (also when unregistered)."""
    return getattr(all_backends().get(name), "label", "") or name


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
        raise ValueError(f"unknown backend {', '.join(map(repr, unknown))}; allowed: {', '.join(registry)}; "
                         + _modules_hint(registry))
    return [registry[n] for n in names]


def _modules_hint(registry: dict[str, Backend]) -> str:
    """What the plugin modules loaded so far registered, or how to load one: a misspelled name of one's own backend
    is then told from a module that was never loaded."""
    if not _LOADED:  # a name that is no built-in is most often the user's own backend, whose module was not loaded
        return "a backend of your own is known once its module is loaded: --backend-module my_attn.py"
    said = []
    for spec in _LOADED:
        names = [name for name in registry if _ORIGIN.get(name) == spec]
        said.append(f"{spec} registered {', '.join(map(repr, names)) if names else 'no backend'}")
    return "loaded: " + "; ".join(said)


def _module_name(spec: str) -> str:
    """The module name a --backend-module spec is imported under (a file's under its stem)."""
    return f"harness_user_{Path(spec).stem}" if _is_file(spec) else spec


def _is_file(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or Path(spec).exists()


def note_loaded(spec: str) -> None:
    """Plugin module `spec` was loaded: imported here, or declared from its own process (isolation/plugin_host.py)."""
    if spec not in _LOADED:
        _LOADED.append(spec)


def replaces(name: str) -> bool:
    """Whether backend `name` was registered with replace=True."""
    return name in _REPLACED


def modules_for(name: str) -> tuple[str, ...]:
    """The plugin module a worker of backend `name` imports: the one that registered it (none for a built-in)."""
    return (_ORIGIN[name],) if name in _ORIGIN else ()


def import_backend_module(spec: str) -> Any:
    """Import a user module in this process so its @register decorators run (each backend noting it as origin)."""
    _IMPORTING.append(module_spec(spec))
    try:
        if _is_file(spec):
            path = Path(spec)
            if not path.is_file():
                raise ValueError(f"--backend-module {spec!r}: no such file")
            mod_name = _module_name(spec)
            loader = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(loader)
            sys.modules[mod_name] = module
            loader.loader.exec_module(module)
            loaded = module_spec(spec)
        else:
            module, loaded = importlib.import_module(spec), spec
    except ValueError:
        raise
    except SystemExit as exc:  # sys.exit() at import: not an Exception, and would end the command without a word
        sys.modules.pop(_module_name(spec), None)
        raise ValueError(f"--backend-module {spec!r} called sys.exit({exc.code!r}) while being imported; a backend "
                         "module may only define and register backends") from None
    except Exception as exc:  # the user's import error, reduced to one line that names the module
        raise ValueError(f"--backend-module {spec!r} failed to import: {type(exc).__name__}: {exc}") from exc
    finally:
        _IMPORTING.pop()
    note_loaded(loaded)
    return module


def module_spec(spec: str) -> str:
    """How workers name plugin module `spec`: an absolute path for a file (a worker may start elsewhere), else the
    dotted name."""
    return str(Path(spec).resolve()) if _is_file(spec) else spec
