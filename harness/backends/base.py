"""The Backend contract and the registry every built-in and user kernel goes through."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, ClassVar

import torch

from harness.case import AttentionCase, dtype_name
from harness.masks import MaskSpec

LAYOUTS = ("bhsd", "bshd")


class Unsupported(Exception):
    """Raised by a backend during a call when it discovers it cannot run a case; becomes 'unsupported'."""


class Backend:
    """An attention implementation.

    Subclasses set `name` and `layout` and implement `forward(q, k, v, *, mask, scale)` where q is
    (batch, heads, seq_q, head_dim) for layout 'bhsd' or (batch, seq_q, heads, head_dim) for 'bshd',
    k/v likewise with kv_heads and seq_k, and `mask` is a harness mask spec or None. The output has
    q's layout. Capabilities are declared as data; `not_supported_reasons` derives the reasons.
    """

    name: ClassVar[str] = ""
    layout: ClassVar[str] = "bhsd"
    #: dtypes accepted (None = any)
    dtypes: ClassVar[tuple[torch.dtype, ...] | None] = None
    #: device types accepted, e.g. ("cuda",); None = any
    devices: ClassVar[tuple[str, ...] | None] = None
    max_head_dim: ClassVar[int | None] = None
    supports_backward: ClassVar[bool] = True
    supports_gqa: ClassVar[bool] = True
    #: the distribution whose version is recorded (None = torch)
    package: ClassVar[str | None] = None
    #: deterministic backward, when the backend claims it
    deterministic: ClassVar[bool | None] = None

    def unavailable_reason(self, device: torch.device) -> str | None:
        """Why this backend cannot run at all here (library missing, wrong device, GPU arch); None if it can."""
        if self.devices is not None and device.type not in self.devices:
            return f"{self.name} runs on {'/'.join(self.devices)} only; device is {device.type}"
        return None

    def not_supported_reasons(self, case: AttentionCase) -> list[str]:
        """Every reason this backend cannot run `case` (empty list = supported)."""
        reasons = []
        if self.dtypes is not None and case.dtype not in self.dtypes:
            allowed = ", ".join(dtype_name(d) for d in self.dtypes)
            reasons.append(f"dtype {dtype_name(case.dtype)} not supported (supports {allowed})")
        if self.max_head_dim is not None and case.head_dim > self.max_head_dim:
            reasons.append(f"head_dim {case.head_dim} > max {self.max_head_dim}")
        if not self.supports_gqa and case.kv_heads != case.heads:
            reasons.append(f"GQA/MQA (kv_heads={case.kv_heads} != heads={case.heads}) not supported")
        return reasons

    def backward_unsupported_reason(self, device: torch.device) -> str | None:
        return None if self.supports_backward else f"{self.name} has no backward"

    def version(self) -> str:
        dist = self.package
        if dist is None:
            return torch.__version__
        try:
            from importlib.metadata import version
            return version(dist)
        except Exception:
            return "not installed"

    def last_op(self) -> str:
        """The kernel that actually ran on the last call, where the backend can tell (else its name)."""
        return self.name

    def compile_time_ms(self) -> float | None:
        """Compile time (ms) of the graph the last call used, for backends that compile; None otherwise."""
        return None

    def to_layout(self, x: torch.Tensor) -> torch.Tensor:
        """Canonical (B, H, S, D) -> this backend's layout; done before timing, never inside `forward`."""
        return x if self.layout == "bhsd" else x.transpose(1, 2)

    def from_layout(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.layout == "bhsd" else x.transpose(1, 2)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: MaskSpec | None,
                scale: float) -> torch.Tensor:
        raise NotImplementedError


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
