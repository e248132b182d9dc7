"""`python -m harness history`: every run under a results directory in one table."""

from __future__ import annotations

import argparse


def _history(args: argparse.Namespace) -> int:
    from harness.compare.history import history_text, load_history

    print(history_text(load_history(args.results_dir)))
    return 0


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser("history", help="summarize every run under a results directory")
    p.add_argument("results_dir", nargs="?", default="results", help="directory of run dirs (default: results)")
    p.set_defaults(func=_history)
