"""`python -m harness history`: every run in one table; --noise: noise models; --changes: change points, trends."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.options import nonnegative_float, positive_float
from harness.measure import stats


def _history(args: argparse.Namespace) -> int:
    from harness.compare.history import history_text, load_history
    from harness.compare.noise import NoiseModel, build_noise_model, noise_path
    history = load_history(args.results_dir)
    if args.testbed is not None:
        known = sorted(set(history.testbed_id.dropna().astype(str)))
        if args.testbed not in known:
            raise ValueError(f"--testbed {args.testbed!r}: no runs of it under {args.results_dir}; "
                             f"testbeds there: {', '.join(known) or 'none'}")
        history = history[history.testbed_id.astype(str) == args.testbed]
    print(history_text(history))
    testbeds = sorted(set(history.testbed_id.dropna().astype(str))) if len(history) else []
    for testbed in testbeds:
        if args.noise:
            build_noise_model(history, testbed, args.results_dir)
        path = noise_path(args.results_dir, testbed)
        if path.exists():
            print(NoiseModel.load(path).summary())
        elif not args.noise:
            print(f"no noise model of testbed {testbed} yet: `history --noise` builds it from the runs above")
    if args.changes:
        from harness.compare.changes import changes_text, detect_changes, key_series, write_trends
        changes = detect_changes(history, penalty=args.penalty, min_effect=args.min_effect)
        print(changes_text(changes, len(key_series(history))))
        out = Path(args.results_dir) / "history"
        out.mkdir(parents=True, exist_ok=True)
        changes.to_csv(out / "changes.csv", index=False)
        index = write_trends(history, changes, out / "trends", every_key=args.all_trends, penalty=args.penalty)
        print(f"wrote {out / 'changes.csv'}, {index}")
    return 0


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser("history", help="summarize every run under a results directory; --noise builds the "
                                              "gate's noise model, --changes finds change points per key")
    p.add_argument("results_dir", nargs="?", default="results", help="directory of run dirs (default: %(default)s)")
    p.add_argument("--testbed", default=None, help="only the runs of this testbed id")
    p.add_argument("--noise", action="store_true",
                   help="(re)build each testbed's noise model (every key's A/A spread) into RESULTS_DIR/noise/")
    p.add_argument("--changes", action="store_true",
                   help="change-point detection per key over the runs (ruptures PELT); writes changes.csv and a "
                        "trend figure per changed key under RESULTS_DIR/history/")
    p.add_argument("--all-trends", action="store_true", help="with --changes: a trend figure for every key")
    p.add_argument("--penalty", type=positive_float, default=stats.PENALTY,
                   help="PELT penalty on the standardized series (default: %(default)s; lower finds smaller steps)")
    p.add_argument("--min-effect", type=nonnegative_float, default=stats.MIN_RUN_CHANGE,
                   help="smallest step (ratio of medians) reported (default: %(default)s)")
    p.set_defaults(func=_history)
