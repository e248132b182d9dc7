"""`python -m harness wheelhouse DIR`: the wheels a GPU node without network needs besides its torch, with a manifest.

On a machine that reaches the package index, downloads binary wheels for the target (python, platform, the
torch's CUDA) into DIR, and writes DIR/manifest.json (name, version, filename, size, sha256 of each); on the
node, `bash setup.sh --offline DIR` installs from it with `pip install --no-index --find-links DIR`.

What goes in, by one rule: the node's image has torch with its own dependencies (typing_extensions, sympy,
networkx, jinja2, fsspec, filelock, triton, the nvidia libraries) and, by default, the scientific stack the harness
imports (numpy, scipy, pandas, matplotlib, pytest); the wheelhouse carries the rest - LEAN below and every optional
backend's library as the backend declares it (its `install`: Install.wheels), each wheel without its dependencies,
so nothing can pull torch in. `--full` adds SCIENTIFIC with everything it depends on, for an image with torch alone.
Never torch, and no nvidia library no backend names. A backend's library goes in only where it fits under
--limit-mib (the lent GPU machine's 64 MiB by default: FlashAttention-4's CUTLASS DSL compiler alone is ~88 MiB) and
has wheels (FlashAttention-2 and -3 build from source); each one left out is one line of manifest.json's "left_out".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from packaging.requirements import Requirement

from harness.backends.catalogue import installs
from harness.store.environment import REPO_ROOT

Runner = Callable[..., subprocess.CompletedProcess]
#: the harness's own requirements beyond the image, pinned as pyproject.toml pins them: each downloaded with --no-deps
LEAN = ("pytest-benchmark>=4,<6", "py-cpuinfo", "ruptures>=1.1.8,<2", "submitit>=1.5", "cloudpickle", "hypothesis>=6",
        "sortedcontainers")  # hypothesis: the property-based tests (its one dep)
#: with --full, downloaded with their dependencies (none of which is torch)
SCIENTIFIC = ("numpy", "scipy>=1.10", "pandas>=2", "matplotlib>=3.7", "pytest>=8")
#: the CUDA majors of a node's torch a wheelhouse is made for
TORCH_CUDA = (12, 13)
#: a wheel of these must never come into the wheelhouse (the node's torch stays the node's)
NEVER = ("torch", "triton")
#: the lent GPU machine's limit on what travels with the checkout (MiB): the wheelhouse's default --limit-mib
CARRY_LIMIT_MIB = 64


#: manylinux's legacy names for glibc 2.17, 2.12 and 2.5
LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def platforms(platform: str) -> list[str]:
    """`platform` and every older tag a node of that platform installs: pip download takes a given --platform
    literally (pip 26 skipped nvidia-cuda-runtime-cu12's py3-none-manylinux2014_x86_64 for manylinux_2_28_x86_64)."""
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not match:
        return [platform]
    newest, arch = int(match.group(1)), match.group(2)
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(newest, 4, -1)]
    return tags + [f"{LEGACY_MANYLINUX[m]}_{arch}" for m in LEGACY_MANYLINUX if m <= newest]


def target_flags(python: str, platform: str) -> list[str]:
    """pip download's flags for wheels that install on CPython `python` ('3.12') on `platform`."""
    return ["--only-binary=:all:", "--python-version", python, "--implementation", "cp", "--abi",
            "cp" + python.replace(".", ""), *(flag for name in platforms(platform) for flag in ("--platform", name))]


def commands(dest: Path, python: str, platform: str, torch_cuda: int, full: bool) -> list[tuple[str, list[str]]]:
    """(what, pip command) for every download: the harness built as a wheel first, then each requirement."""
    if torch_cuda not in TORCH_CUDA:
        raise ValueError(f"--torch-cuda {torch_cuda}: allowed {', '.join(map(str, TORCH_CUDA))}")
    pip = [sys.executable, "-m", "pip"]
    flags = target_flags(python, platform)
    cmds = [("attention-harness", [*pip, "wheel", "--no-deps", "--wheel-dir", str(dest), str(REPO_ROOT)])]
    cmds += [(req, [*pip, "download", "--no-deps", *flags, "--dest", str(dest), req]) for req in LEAN]
    if full:
        cmds.append((" ".join(SCIENTIFIC), [*pip, "download", *flags, "--dest", str(dest), *SCIENTIFIC]))
    return cmds


def _pip_says(output: str) -> str:
    """pip's own first ERROR line (what it could not find), or its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors or lines or ["no output"])[0]


def manifest(dest: Path) -> dict:
    """Every wheel in `dest`: name, version, filename, size, sha256 (names as pip normalizes them)."""
    from packaging.utils import parse_wheel_filename
    wheels = []
    for path in sorted(dest.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(path.name)
        wheels.append({"name": str(name), "version": str(version), "filename": path.name,
                       "size": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    return {"wheels": wheels, "total_bytes": sum(w["size"] for w in wheels)}


def _download(cmds: list[tuple[str, list[str]]], target: str, run: Runner) -> None:
    for what, cmd in cmds:
        proc = run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ValueError(f"no wheel of {what} for {target}: pip says: {_pip_says(proc.stdout + proc.stderr)}")


def add_if_it_fits(dest: Path, wheels: tuple[str, ...], what: str, python: str, platform: str, limit_mib: float,
                   run: Runner = subprocess.run) -> str:
    """Download `wheels` (each --no-deps) into a staging folder and move them into `dest` when it stays within
    `limit_mib` (0 = no limit); otherwise leave them all out and return the one line that says why ('' when in)."""
    from packaging.utils import parse_wheel_filename
    stage = dest / f".staging-{what}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    have, limit = sum(path.stat().st_size for path in dest.glob("*.whl")), limit_mib * 2**20
    flags = target_flags(python, platform)
    try:
        for req in wheels:
            try:
                _download([(req, [sys.executable, "-m", "pip", "download", "--no-deps", *flags, "--dest", str(stage),
                                  req])], f"python {python}, {platform}", run)
            except ValueError as exc:
                return f"{what} left out of the wheelhouse: {exc}"
            sizes = {path: path.stat().st_size for path in stage.glob("*.whl")}
            if limit and have + sum(sizes.values()) > limit:
                big = max(sizes, key=sizes.get)
                return (f"{what} left out of the wheelhouse: with {parse_wheel_filename(big.name)[0]} "
                        f"({sizes[big] / 2**20:.1f} MiB) it would be {(have + sum(sizes.values())) / 2**20:.1f} MiB, "
                        f"over --limit-mib {limit_mib:g} (--limit-mib 0 takes it, for a node reached by rsync; a node "
                        "with network: bash setup.sh)")
        for path in stage.glob("*.whl"):
            path.replace(dest / path.name)
        return ""
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def build(dest: Path, python: str = "3.12", platform: str = "manylinux_2_28_x86_64", torch_cuda: int = 13,
          full: bool = False, run: Runner = subprocess.run, limit_mib: float = CARRY_LIMIT_MIB) -> dict:
    """Download everything into `dest` and write dest/manifest.json; one-line ValueError when pip finds no wheel
    for a package of the harness, or a forbidden wheel (torch) came in. Then each optional backend's library in
    BUILT_IN's order, if it has wheels and stays within `limit_mib`; "left_out" says why of each one that did not."""
    from packaging.utils import canonicalize_name
    dest.mkdir(parents=True, exist_ok=True)
    target = f"python {python}, {platform}, torch CUDA {torch_cuda}"
    _download(commands(dest, python, platform, torch_cuda, full), target, run)
    left_out, declared = {}, set()
    for name, install in installs().items():
        if install.builds_from_source:
            left_out[name] = f"{name} left out of the wheelhouse: {install.builds_from_source}"
            continue
        wheels = install.wheels(torch_cuda)
        declared |= {canonicalize_name(Requirement(w).name) for w in wheels}
        why = add_if_it_fits(dest, wheels, name, python, platform, limit_mib, run)
        if why:
            left_out[name] = why
    found = manifest(dest)
    forbidden = [w["filename"] for w in found["wheels"] if w["name"] in NEVER or
                 (w["name"].startswith("nvidia-") and w["name"] not in declared)]
    if forbidden:
        raise ValueError(f"the wheelhouse must not carry {', '.join(forbidden)} (the node's torch stays): remove them")
    found["target"] = {"python": python, "platform": platform, "torch_cuda": torch_cuda, "full": full,
                       "limit_mib": limit_mib}
    found["left_out"] = left_out
    (dest / "manifest.json").write_text(json.dumps(found, indent=1))
    return found


def unmet(dist: str = "attention-harness", extras: tuple[str, ...] = ("slurm",)) -> list[str]:
    """Requirements of installed `dist` (with `extras`) that this environment does not satisfy: what an offline
    install (every wheel with --no-deps, so pip never re-resolves the node's torch) leaves missing."""
    from importlib.metadata import PackageNotFoundError, requires, version

    from packaging.requirements import Requirement
    missing = []
    for text in requires(dist) or []:
        req = Requirement(text)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
            continue
        try:
            have = version(req.name)
        except PackageNotFoundError:
            missing.append(f"{req} (not installed)")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            missing.append(f"{req} (have {have})")
    return missing


def report_unmet() -> int:
    """Print what the harness still lacks after an offline install (setup.sh --offline); 1 when anything."""
    missing = unmet()
    if missing:
        print(f"setup.sh --offline: missing on this node and not in the wheelhouse: {'; '.join(missing)} "
              "(python -m harness wheelhouse --full carries the scientific stack)")
    return 1 if missing else 0


def _wheelhouse(args: argparse.Namespace) -> int:
    found = build(Path(args.dir), args.python, args.platform, args.torch_cuda, args.full, limit_mib=args.limit_mib)
    for w in found["wheels"]:
        print(f"  {w['filename']:<70} {w['size'] / 2**20:7.2f} MiB")
    for line in found["left_out"].values():
        print(line)
    print(f"{len(found['wheels'])} wheels, {found['total_bytes'] / 2**20:.1f} MiB in {args.dir} (manifest.json); "
          f"on the node: bash setup.sh --offline {args.dir}")
    return 0


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser("wheelhouse", help="download the wheels an offline GPU node needs (not torch)",
                              description=__doc__.split("\n\n", 1)[1])
    p.add_argument("dir", help="where the wheels and manifest.json go")
    p.add_argument("--python", default="3.12", help="the node's CPython version. Default: %(default)s")
    p.add_argument("--platform", default="manylinux_2_28_x86_64",
                   help="the node's wheel platform tag (older manylinux tags are accepted too). Default: %(default)s")
    p.add_argument("--torch-cuda", type=int, default=13, choices=TORCH_CUDA,
                   help="the CUDA major of the node's torch (13: add the CUDA 12 runtime xformers' wheel links). "
                        "Default: %(default)s")
    p.add_argument("--full", action="store_true",
                   help="also the scientific stack (numpy, scipy, pandas, matplotlib, pytest, with their "
                        "dependencies) for an image that has torch alone (~90 MiB more)")
    p.add_argument("--limit-mib", type=float, default=CARRY_LIMIT_MIB,
                   help="a backend's library goes in only if the wheelhouse stays within this size (FlashAttention-4's "
                        "CUTLASS DSL compiler is ~88 MiB); 0 = no limit. Default: %(default)g (the lent GPU machine's "
                        "carry limit)")
    p.set_defaults(func=_wheelhouse)
