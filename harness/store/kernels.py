"""A run keeps the kernels it timed: each plugin module's source copied into the run folder with its sha256."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import sysconfig
from pathlib import Path

#: the run folder's subfolder of kernel sources (env.json's backend_sources name each copy relative to the run)
KERNELS = "kernels"


def is_file_module(spec: str) -> bool:
    """Whether a --backend-module spec names a .py file (else a dotted module name)."""
    return spec.endswith(".py") or "/" in spec or Path(spec).exists()


def _sha256(path: Path) -> str:
    """Of a file, or of a folder's .py files (relative names and contents, in order)."""
    digest = hashlib.sha256()
    for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
        digest.update(str(file.relative_to(path)).encode() if path.is_dir() else b"")
        digest.update(file.read_bytes())
    return digest.hexdigest()


def source_version(spec: str) -> str | None:
    """A plugin module's version as its source's: 'sha256:' and the first 12 hex digits of the file's (a local
    package's .py files'), so history tells two versions of a kernel apart; None for an installed package (its
    package metadata says) or a module found nowhere."""
    source = _source(spec)
    if source is None or not source.exists():
        return None
    return "sha256:" + _sha256(source)[:12]


def _source(spec: str) -> Path | None:
    """Where a --backend-module spec's source lies: the file, or a local package's folder (None: installed)."""
    return Path(spec).resolve() if is_file_module(spec) else _local_package(spec)


def _local_package(name: str) -> Path | None:
    """The local folder (or file) of a module given by name, where it is not an installed package; found without
    importing it (a plugin's code never runs in the run's process): the top-level package is what is kept."""
    top = name.split(".")[0]
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if found is None or not found.origin or found.origin in ("built-in", "frozen"):
        return None
    origin = Path(found.origin).resolve()
    installed = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib", "stdlib")}
    if any(origin.is_relative_to(p) for p in installed) or top == "harness":
        return None
    return origin.parent if found.submodule_search_locations else origin


def keep_sources(run_dir: Path, specs: list[str]) -> list[dict]:
    """Copy each plugin module's source into run_dir/kernels/NN/ under its own name (a local package as its folder),
    so a copy imports under the module name the original did, and return env.json's records: {"module", "source", "copy", "sha256"}; a module found nowhere local
    (an installed package) is recorded with no copy."""
    records = []
    for i, spec in enumerate(specs):
        source = _source(spec)
        record = {"module": str(source) if is_file_module(spec) else spec, "source": str(source) if source else None,
                  "copy": None, "sha256": None}
        if source is not None and source.exists():
            copy = Path(KERNELS) / f"{i:02d}" / source.name
            target = run_dir / copy
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
            else:
                shutil.copyfile(source, target)
            record.update(copy=str(copy), sha256=_sha256(source))
        records.append(record)
    return records


def timed_module(record: dict, run_dir: Path) -> str:
    """The module spec that times a run's kernel again: its copy in the run folder (a file), else as given (a
    package by name is imported where it is installed: its copy is the record of what ran)."""
    copy = record.get("copy")
    if copy and is_file_module(record["module"]) and (run_dir / copy).is_file():
        return str(run_dir / copy)
    return record["module"]


def describe(record: dict) -> str:
    """'kernels/00/my_attn.py (sha256 1a2b3c4d)' - or the module, when the run kept no copy."""
    return f"{record['copy']} (sha256 {record['sha256'][:8]})" if record.get("copy") else f"{record['module']} (not kept)"
