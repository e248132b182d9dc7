"""What a backend class declares, checked once when it registers: `forward`'s signature and the capabilities."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from harness.backends.base import LAYOUTS, NATIVE_PROBES, Backend, KnownFailure
from harness.backends.install import Install

#: device types a capability may name (torch.device's types that a harness run can be given)
DEVICE_TYPES = ("cpu", "cuda")


def _optional_tuple(of: type, label: str, allowed: tuple | None = None) -> Callable[[Any], str | None]:
    def check(value):
        if value is None:
            return None
        if not isinstance(value, tuple) or not value or not all(isinstance(v, of) for v in value):
            return f"must be None or a non-empty tuple of {label}"
        bad = [v for v in value if allowed is not None and v not in allowed]
        return f"{', '.join(map(repr, bad))} not allowed; allowed: {', '.join(allowed)}" if bad else None
    return check


def _instance(types: type | tuple[type, ...], what: str) -> Callable[[Any], str | None]:
    return lambda value: None if isinstance(value, types) else f"must be {what}"


def _max_head_dim(value) -> str | None:
    ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)
    return None if ok else "must be None or an integer >= 1"


def _native_probes(value) -> str | None:
    if not isinstance(value, (frozenset, set, tuple)) or not all(isinstance(v, str) for v in value):
        return f"must be a frozenset of names from {', '.join(NATIVE_PROBES)}"
    bad = sorted(set(value) - set(NATIVE_PROBES))
    return f"{', '.join(map(repr, bad))} not allowed; allowed: {', '.join(NATIVE_PROBES)}" if bad else None


def _optional_name(what: str) -> Callable[[Any], str | None]:
    return lambda value: None if value is None or (isinstance(value, str) and value) else f"must be None or {what}"


def _relative_speed(value) -> str | None:
    if not isinstance(value, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                                              for v in value.values()):
        return "must be a dict of device type -> a number > 0, e.g. {'cpu': 0.5}"
    bad = [k for k in value if k not in DEVICE_TYPES]
    return f"{', '.join(map(repr, bad))} not allowed; allowed: {', '.join(DEVICE_TYPES)}" if bad else None


def _known_failures(value) -> str | None:
    if not isinstance(value, tuple) or not all(isinstance(v, KnownFailure) for v in value):
        return "must be a tuple of KnownFailure(probe, case, why, device=None)"
    bad = [f.device for f in value if f.device is not None and f.device not in DEVICE_TYPES]
    return f"device {', '.join(map(repr, bad))} not allowed; allowed: {', '.join(DEVICE_TYPES)}" if bad else None


_flag = _instance(bool, "True or False")

#: each capability attribute of Backend and the check of its declared value (None = fine, else what is wrong)
CAPABILITIES: dict[str, Callable[[Any], str | None]] = {
    "dtypes": _optional_tuple(torch.dtype, "torch dtypes, e.g. (torch.float16, torch.bfloat16)"),
    "devices": _optional_tuple(str, "device types, e.g. ('cuda',)", DEVICE_TYPES),
    "backward_devices": _optional_tuple(str, "device types, e.g. ('cuda',)", DEVICE_TYPES),
    "max_head_dim": _max_head_dim,
    "supports_backward": _flag,
    "supports_gqa": _flag,
    "compiles_per_shape": _flag,
    "relative_speed": _relative_speed,
    "paged_kv": _flag,
    "mixed_batch": _flag,
    "fp8_kv": _flag,
    "fp8_q": _flag,
    "native_probes": _native_probes,
    "deterministic": _instance((type(None), bool, str), "None, True/False or a string"),
    "package": _optional_name("a distribution name"),
    "version_name": _optional_name("env.json's name for the package's version"),
    "label": _instance(str, "a string ('' = the backend's name)"),
    "colour": _optional_name("a matplotlib colour, e.g. '#1f77b4'"),
    "marker": _optional_name("a matplotlib marker, e.g. 'o'"),
    "library": _instance(str, "a string ('' = its label)"),
    "install": _instance((type(None), Install), "None or an Install(requirement=..., because=...)"),
    "known_failures": _known_failures,
}
#: forward's keyword parameters every call passes
FORWARD_KEYWORDS = ("mask", "scale")


def forward_problem(cls: type[Backend]) -> str | None:
    """What is wrong with `cls.forward`'s signature for the call `forward(q, k, v, mask=..., scale=...)`, or None."""
    try:
        params = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return None  # a builtin or C callable without a signature: the call itself will tell
    kinds = inspect.Parameter
    if any(p.kind is kinds.VAR_KEYWORD for p in params.values()):
        return None
    missing = [k for k in FORWARD_KEYWORDS
               if k not in params or params[k].kind not in (kinds.KEYWORD_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    positional = [p for p in params.values() if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
                  and p.name not in FORWARD_KEYWORDS]
    has_varargs = any(p.kind is kinds.VAR_POSITIONAL for p in params.values())
    signature = f"forward{inspect.signature(cls.forward)}"
    if missing:
        what = f"{missing[0]} as a keyword argument" if len(missing) == 1 else "mask and scale as keyword arguments"
        return f"{signature} must take {what}: def forward(self, q, k, v, *, mask, scale)"
    if len(positional) < 4 and not has_varargs:  # self, q, k, v
        return f"{signature} must take q, k, v positionally: def forward(self, q, k, v, *, mask, scale)"
    return None


def declaration_problems(cls: type[Backend]) -> list[str]:
    """Every problem of the class's declaration (name, layout, capabilities, forward), each one short line."""
    problems = []
    if not cls.name or not isinstance(cls.name, str):
        problems.append(f"name={cls.name!r}: needs a non-empty string `name`")
    if cls.layout not in LAYOUTS:
        problems.append(f"layout={cls.layout!r}; allowed: {', '.join(LAYOUTS)}")
    for attr, check in CAPABILITIES.items():
        value = getattr(cls, attr)
        why = check(value)
        if why:
            problems.append(f"{attr}={value!r}: {why}")
    why = forward_problem(cls)
    if why:
        problems.append(why)
    return problems


def where(cls: type) -> str:
    """'path/to/file.py:LINE' of the class, as far as Python can tell."""
    try:
        return f"{inspect.getsourcefile(cls)}:{inspect.getsourcelines(cls)[1]}"
    except (OSError, TypeError):
        return f"module {cls.__module__}"
