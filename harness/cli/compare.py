"""`python -m harness compare BASE NEW`: the regression gate between two runs (exit 1 on a regression)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.options import COMPARE_THRESHOLDS, add_to_argparse, compare_config


def _compare(args: argparse.Namespace) -> int:
    from harness.compare.report import terminal_table, write_report
    from harness.compare.runs import compare_runs
    from harness.store.run_dir import resolve_run

    base, new = resolve_run(args.base, args.results_dir), resolve_run(args.new, args.results_dir)
    comparison = compare_runs(base, new, compare_config(args), cross_device=args.cross_device)
    out = Path(args.out) if args.out else new / f"compare-vs-{base.name}"
    files = write_report(comparison, out)
    print(terminal_table(comparison))
    print("wrote " + ", ".join(str(p) for p in files.values()))
    return 1 if comparison.regression else 0


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser("compare", help="compare two runs per (case, backend, phase); exit 1 on a regression")
    p.add_argument("base", help="base run dir (or run id under --results-dir)")
    p.add_argument("new", help="new run dir (or run id under --results-dir)")
    add_to_argparse(p, *COMPARE_THRESHOLDS)
    p.add_argument("--cross-device", action="store_true",
                   help="allow runs from different testbeds: a cross-device report, not a gate (exit 0)")
    p.add_argument("--out", default=None, help="report directory (default: NEW/compare-vs-BASE)")
    add_to_argparse(p, "results_dir")
    p.set_defaults(func=_compare)
