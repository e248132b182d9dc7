"""`python -m harness report RUN_DIR`: the report and its figures from stored results."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.store.schema import BASELINE


def _report(args: argparse.Namespace) -> int:
    from harness.report.document import build_report
    from harness.store.run_dir import read_env
    from harness.store.run_state import run_notes
    backends = [b.strip() for b in args.backends.split(",") if b.strip()] if args.backends else None
    # an explicit --baseline must exist in the run; the default one may be absent (then no speedups)
    path = build_report(args.run_dir, baseline=args.baseline or BASELINE, out_dir=args.out, backends=backends,
                        dtype=args.dtype, mask=args.mask, strict_baseline=args.baseline is not None)
    for note in run_notes(read_env(args.run_dir)):  # refused lines were warned as they were read
        print(f"note: {note}")
    print(f"report: {path}")
    print(f"report: {path.with_suffix('.md')}")
    return 0


def add_subcommand(subparsers: argparse._SubParsersAction) -> None:
    """Add `report`: it reads a run directory and writes under --out (default: the run dir)."""
    help_text = "write report.html (self-contained) and report.md with every figure (PNGs under figures/)"
    p = subparsers.add_parser("report", help=help_text, description=help_text)
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a results/<run_id> directory")
    p.add_argument("--baseline", default=None,
                   help=f"backend the speedups are relative to (default: {BASELINE}); kept under "
                        "--backends")
    p.add_argument("--backends", default=None, help="comma-separated backends to show (default: all)")
    p.add_argument("--dtype", default=None, help="only cases of this dtype, e.g. bf16 (default: all)")
    p.add_argument("--mask", default=None, help="only this mask family or id, e.g. causal (default: all)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default: RUN_DIR)")
    p.set_defaults(func=_report)
