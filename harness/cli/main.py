"""`python -m harness <command>`: the parser built from one module per command, and one-line errors for bad input."""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from harness.cli.early import refusal

#: each defines `add_subcommand(subparsers)`: adds its parser, sets `func` (parsed args -> exit code)
COMMAND_MODULES: list[str] = ["harness.cli.check", "harness.cli.backends", "harness.cli.history",
                              "harness.cli.compare", "harness.cli.run", "harness.cli.report", "harness.cli.recommend",
                              "harness.cli.node.selftest", "harness.cli.node.wheelhouse"]


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the flag, the value and what is allowed, without the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def description() -> str:
    """What `python -m harness --help` says the tool is, the libraries read from the registry (the module docstring
    describes the parser, for developers)."""
    from harness.backends.catalogue import libraries, prose
    return (f"Check attention kernels ({prose(libraries())}, or your own) against an exact float64 reference, time "
            "them, guard them against regressions, and recommend one for a workload. Start with: backends, then "
            "check --backend-module my_attn.py --backends my-attn, then recommend. The full benchmark is `pytest "
            "suites --benchmark`.")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m harness", description=description())
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_subcommand(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # a warning as the commands print it: one line, the message alone (it names the file and line it is about)
    default_format, warnings.formatwarning = warnings.formatwarning, lambda message, *_, **__: f"warning: {message}\n"
    try:  # restored after: main() may be called in a process that goes on (tests, a notebook)
        if why := refusal(sys.argv[1:] if argv is None else argv):
            print(f"error: {why}", file=sys.stderr)
            return 2
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help, or a bad option (already printed in one line)
            return exc.code if isinstance(exc.code, int) else 2
        try:
            return args.func(args)
        except (ValueError, FileNotFoundError) as exc:  # bad input: one line naming the value, exit 2
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:  # Ctrl-C, or a backend that raised it: what finished is written
            print(f"interrupted{': ' + str(exc) if str(exc) else ''}", file=sys.stderr)
            return 130
    finally:
        warnings.formatwarning = default_format
