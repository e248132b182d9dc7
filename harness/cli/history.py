"""`python -m harness history`: every run in one table; --noise: noise models; --changes: change points, trends
(all read from the history index, history/index.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.options import nonnegative_float, positive_float
from harness.measure import stats
from harness.store.schema import KEY


def _history(args: argparse.Namespace) -> int:
    from harness.history.stored import summary_text
    from harness.history.index import CHANGE_COLUMNS, CODE_COLUMNS, open_index
    from harness.history.noise import NoiseModel, build_noise_model, noise_path
    index = open_index(args.results_dir, args.store)
    testbeds = index.testbeds()
    if args.testbed is not None:
        if args.testbed not in testbeds:
            raise ValueError(f"--testbed {args.testbed!r}: no runs of it under {args.results_dir}; "
                             f"testbeds there: {', '.join(testbeds) or 'none'}")
        testbeds = [args.testbed]
    print(summary_text(index.summary(args.testbed), index.notes(args.testbed)))
    for testbed in testbeds:
        if args.noise:  # a testbed's rows and rounds read some runs at a time (1,500 runs at once: over 1 GB)
            build_noise_model(index.noise_parts(("testbed_id", *KEY, *CODE_COLUMNS), testbed), testbed,
                              args.results_dir)
        path = noise_path(args.results_dir, testbed)
        if path.exists():
            print(NoiseModel.load(path).summary())
        elif not args.noise:
            print(f"no noise model of testbed {testbed} yet: `history --noise` builds it from the runs above")
    if args.changes:
        from harness.history.changes import changes_text, detect_changes, runs_needed, timed_runs, write_trends
        from harness.history.trends_page import write_trends_page
        history = timed_runs(index.rows(CHANGE_COLUMNS, testbed=args.testbed, timed=True),  # grouped once
                             include_loaded=args.include_loaded)
        changes = detect_changes(history, penalty=args.penalty, min_effect=args.min_effect)
        needed = runs_needed(history)
        print(changes_text(changes, len(history.keys), needed))
        out = Path(args.results_dir) / "history"
        out.mkdir(parents=True, exist_ok=True)
        changes.to_csv(out / "changes.csv", index=False)
        page = write_trends_page(history, changes, out / "changes.html", args.results_dir, penalty=args.penalty,
                                 needed=needed)
        wrote = [out / "changes.csv", page]
        if args.trend_figures or args.all_trends:  # PNGs on request: ~0.2 s each, and the page draws every trend
            wrote.append(write_trends(history, changes, out / "trends", every_key=args.all_trends,
                                      penalty=args.penalty))
        print(f"wrote {', '.join(map(str, wrote))}")
    return 0


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser("history", help="summarize every run under a results directory; --noise builds the "
                                              "gate's noise model, --changes finds change points per key")
    p.add_argument("results_dir", nargs="?", default="results", help="directory of run dirs (default: %(default)s)")
    p.add_argument("--testbed", default=None, help="only the runs of this testbed id")
    p.add_argument("--store", default=None, metavar="PATH_OR_URL",
                   help="the history index: a folder (shared by a team's machines: each run is its own file) or a "
                        "postgresql:// URL (default: RESULTS_DIR/index, made on first use; each run folder is "
                        "read once, again when its files change)")
    p.add_argument("--noise", action="store_true",
                   help="(re)build each testbed's noise model (every key's A/A spread) into RESULTS_DIR/noise/")
    p.add_argument("--changes", action="store_true",
                   help="change-point detection per key over the runs (ruptures PELT); writes changes.csv and "
                        "changes.html (every changed key's trend, filterable) under RESULTS_DIR/history/")
    p.add_argument("--trend-figures", action="store_true",
                   help="with --changes: also a PNG trend figure per changed key, and trends.md listing them, under "
                        "RESULTS_DIR/history/trends/")
    p.add_argument("--all-trends", action="store_true",
                   help="with --changes: a PNG trend figure for every key (--trend-figures for all)")
    p.add_argument("--include-loaded", action="store_true",
                   help="with --changes: keep the key-runs timed beside other load (their contention, the share of "
                        "the CPUs other processes took, over half), which are left out by default")
    p.add_argument("--penalty", type=positive_float, default=stats.PENALTY,
                   help="PELT penalty on the standardized series (default: %(default)s; lower finds smaller steps)")
    p.add_argument("--min-effect", type=nonnegative_float, default=stats.MIN_RUN_CHANGE,
                   help="smallest step (ratio of medians) reported (default: %(default)s)")
    p.set_defaults(func=_history)
