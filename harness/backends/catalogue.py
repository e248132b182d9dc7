"""What the built-in backends' declarations say in one place: their libraries in prose, pip's extras, the installs."""

from __future__ import annotations

from harness.backends.install import Install
from harness.backends.registry import all_backends, built_in_names

#: pyproject.toml's extra that installs every optional backend's library
ALL_EXTRA = "gpu"


def libraries() -> list[str]:
    """The libraries the built-in backends call, each once, in BUILT_IN's order (a backend's `library`, else its label
    or name): what README's first paragraph, pyproject's description and --help name."""
    backends = all_backends()
    names = [backends[n].library or backends[n].label or n for n in built_in_names()]
    return list(dict.fromkeys(names))


def prose(names: list[str]) -> str:
    """'a, b and c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def installs() -> dict[str, Install]:
    """Each built-in backend that installs a library of its own (its name -> its Install), in BUILT_IN's order."""
    backends = all_backends()
    return {n: backends[n].install for n in built_in_names() if backends[n].install is not None}


def extras() -> dict[str, list[str]]:
    """pyproject.toml's optional dependencies for the backends: one extra per backend (its name) with its
    requirement, and ALL_EXTRA with all of them."""
    found = {name: [install.requirement] for name, install in installs().items()}
    return {**found, ALL_EXTRA: [req for reqs in found.values() for req in reqs]}


def setup_step(install: Install, gpu: bool, torch_cuda: str | None) -> list[str] | str:
    """What setup.sh does for a backend's library on a machine with (`gpu`) or without a GPU beside a torch of CUDA
    `torch_cuda`: pip install's arguments, or why it installs nothing (one line)."""
    if install.builds_from_source:
        return f"not installed: {install.builds_from_source}"
    if install.gpu_machine_only and not gpu:
        return f"not installed on a machine without a GPU: {install.gpu_machine_only}"
    try:
        return install.pip_arguments(torch_cuda, gpu)
    except ValueError as exc:  # no build of it for this torch
        return f"not installed: {exc}"
