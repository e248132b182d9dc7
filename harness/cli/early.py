"""Argument errors found before the heavy imports (torch): a file that is not there, a preset, matrix or built-in
backend that no definition has - the names read from the defining modules' source, not imported."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
#: flags whose value is a file the command reads: refused when it names a file that is not there (a --backend-module
#: given as a dotted module name is not a file)
FILE_FLAGS = ("--backend-module", "--workload", "--hf-config")
#: the commands whose --preset, --matrix and --backends take the names below
NAMED = {"check": ("--preset", "--matrix", "--backends"), "recommend": ("--backends",), "backends": ("--backends",)}


def refusal(argv: list[str]) -> str:
    """'' unless an argument is wrong in a way known without importing torch: then the one line the command itself
    would give. Under two seconds on any machine (issue 67: 12-22 s, the imports first, under load)."""
    return missing_file(argv) or unknown_name(argv)


def _values(argv: list[str], flag: str) -> list[str]:
    out = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name == flag:
            out.append(value if eq else argv[i + 1] if i + 1 < len(argv) else "")
    return out


def missing_file(argv: list[str]) -> str:
    for flag in FILE_FLAGS:
        for value in _values(argv, flag):
            looks_like_file = value.endswith((".py", ".toml", ".yaml", ".yml", ".json")) or "/" in value
            if value and looks_like_file and not Path(value).is_file():
                return f"{flag} {value!r}: no such file"
    return ""


def unknown_name(argv: list[str]) -> str:
    """The command's own error for a --preset, --matrix or --backends value no definition has (cases/presets.py,
    cases/matrices.py, registry.get_backends); backends only when no --backend-module may register others."""
    flags = NAMED.get(argv[0] if argv else "", ())
    for value in _values(argv, "--preset") if "--preset" in flags else ():
        if value not in preset_names():
            return f"unknown preset {value!r}; allowed: {', '.join(preset_names())}"
    for value in _values(argv, "--matrix") if "--matrix" in flags else ():
        auto, *matrices, fuzz = matrix_names()
        if value not in matrix_names():
            return f"unknown matrix {value!r}; allowed: {auto}, {', '.join(matrices)}, {fuzz}"
    if "--backends" in flags and not _values(argv, "--backend-module"):
        for value in _values(argv, "--backends"):
            names = [n.strip() for n in value.split(",") if n.strip()]
            unknown = [n for n in names if n not in builtin_backend_names()] if names != ["all"] else []
            if unknown:
                return (f"unknown backend {', '.join(map(repr, unknown))}; allowed: "
                        f"{', '.join(builtin_backend_names())}; a backend of your own is known once its module is "
                        "loaded: --backend-module my_attn.py")
    return ""


@functools.cache
def _tree(relative: str) -> ast.Module:
    return ast.parse((PACKAGE / relative).read_text())


def _constants(tree: ast.Module) -> dict[str, str]:
    """A module's top-level NAME = "string" assignments."""
    return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for t in node.targets if isinstance(t, ast.Name)}


def _first_arguments(tree: ast.Module, callee: str) -> list[str]:
    """The string first argument of every call of `callee` in the module, in source order."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == callee and n.args and isinstance(n.args[0], ast.Constant)]
    return [c.args[0].value for c in sorted(calls, key=lambda c: (c.lineno, c.col_offset))]


@functools.cache
def preset_names() -> tuple[str, ...]:
    """cases/presets.py's PRESETS keys: each ModelShape's name."""
    return tuple(_first_arguments(_tree("cases/presets.py"), "ModelShape"))


@functools.cache
def matrix_names() -> tuple[str, ...]:
    """AUTO, cases/matrices.py's registered matrices (each Matrix's name), FUZZ: what resolve_matrix takes."""
    tree = _tree("cases/matrices.py")
    constants = _constants(tree)
    return (constants["AUTO"], *_first_arguments(tree, "Matrix"), constants["FUZZ"])


@functools.cache
def builtin_backend_names() -> tuple[str, ...]:
    """The `name` of every @register class of the modules in backends/registry.py's BUILT_IN, in its order (a name
    given as a constant of the module or of store/schema.py resolved)."""
    modules = next(n for n in ast.walk(_tree("backends/registry.py")) if isinstance(n, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "BUILT_IN" for t in n.targets))
    shared = _constants(_tree("store/schema.py"))
    names = []
    listed = next(t for t in ast.walk(modules.value) if isinstance(t, ast.Tuple) and t.elts
                  and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in t.elts))
    for module in (e.value for e in listed.elts):
        tree = _tree(f"backends/{module}.py")
        constants = {**shared, **_constants(tree)}
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)
                    and any(isinstance(d, ast.Name) and d.id == "register" for d in n.decorator_list)):
            for node in cls.body:
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "name"
                                                        for t in node.targets):
                    value = node.value
                    names.append(value.value if isinstance(value, ast.Constant) else constants[value.id])
    return tuple(names)
