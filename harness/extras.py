"""Optional dependencies: a command that needs one that is missing says, in one line, which extra installs it."""

from __future__ import annotations

#: what each extra of pyproject.toml adds, for the messages (tests/unit/test_extras.py holds them to pyproject.toml)
EXTRAS = {"history": ("pyarrow", "ruptures", "numba"), "postgres": ("psycopg",), "slurm": ("submitit",)}


class MissingExtra(ValueError):
    """A command needs an optional dependency that is not installed (a ValueError: the CLI prints it, exit 2)."""


def missing(module: str, needed_for: str) -> MissingExtra:
    """The error for `module` missing where `needed_for` needs it, naming the extra that installs it."""
    extra = next(name for name, modules in EXTRAS.items() if module in modules)
    return MissingExtra(f"{needed_for} needs {module}, which is not installed here: "
                        f"pip install 'attention-harness[{extra}]' (bash setup.sh installs it)")
