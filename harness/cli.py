"""Command line: `python -m harness check ...`; other subcommands live in the modules of SUBCOMMAND_MODULES.

Each of those modules defines `add_subcommand(subparsers)`, which adds its parser and sets `func`
(a callable taking the parsed args and returning the exit code).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import importlib

from harness.matrices import MATRICES

SUBCOMMAND_MODULES: list[str] = ["harness.regress_cli", "harness.report_cli", "harness.recommend_cli"]


def _check(args: argparse.Namespace) -> int:
    from harness.api import check
    from harness.backends.base import load_backend_module
    from harness.env import new_run_id

    for module in args.backend_module:
        load_backend_module(module)
    run_id = new_run_id()
    path = Path(args.results_dir) / run_id / "results.csv" if args.results_dir else None
    df = check(args.backends, args.matrix, args.device, results_path=path, seed=args.seed, run_id=run_id)
    per_case = df.groupby(["backend", "case_id"]).status.agg(_worst)
    summary = per_case.groupby(level=0).value_counts().unstack(fill_value=0)
    print(summary.to_string())
    bad = df[df.status.isin(["fail", "error"])]
    for row in bad.itertuples():
        print(f"{row.status.upper()} {row.backend} {row.case_id} [{row.phase}]: {row.reason}")
    if path:
        print(f"results: {path}")
    return 1 if len(bad) else 0


def _worst(statuses) -> str:
    order = ["error", "oom", "fail", "pass", "unsupported", "unavailable", "observed"]
    present = set(statuses)
    return next(s for s in order if s in present)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="check backends for correctness; exit 1 when any case fails")
    p.add_argument("--backends", default="all", help="comma-separated backend names or 'all'")
    p.add_argument("--backend-module", action="append", default=[], help="module or .py path registering backends")
    p.add_argument("--matrix", default="smoke", help=f"one of {', '.join(MATRICES)} (default: smoke)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--results-dir", default=None, help="also write results/<run_id>/results.csv under this dir")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_check)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).add_subcommand(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:  # bad input: one line naming the value, exit 2
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
