"""`python -m harness compare BASE NEW`: the regression gate between two runs.

Exit codes: 0 no regression and every timed key decided; 1 a regression (slower, correctness worse or lost,
keys missing from the new run); 3 undecided keys remain (unless --no-fail-on-undecided); 2 bad input.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.options import COMPARE_THRESHOLDS, add_to_argparse, compare_config, positive_float
from harness.compare.remeasure import RemeasureConfig


def _compare(args: argparse.Namespace) -> int:
    from harness.history.noise import NoiseModel
    from harness.compare.remeasure import remeasure
    from harness.compare.report import terminal_table, write_report
    from harness.compare.runs import compare_runs
    from harness.store.run_dir import resolve_run
    if args.remeasure_max_pairs < RemeasureConfig.min_rounds:
        raise ValueError(f"--remeasure-max-pairs={args.remeasure_max_pairs}: must be >= {RemeasureConfig.min_rounds} "
                         "(a key is never passed on fewer pairs)")
    base, new = resolve_run(args.base, args.results_dir), resolve_run(args.new, args.results_dir)
    noise = NoiseModel.load(args.noise) if args.noise else None
    comparison = compare_runs(base, new, compare_config(args), cross_device=args.cross_device, noise=noise,
                              allow_missing=args.allow_missing, use_noise_model=args.noise_model)
    if args.remeasure:
        remeasure(comparison, RemeasureConfig(budget_s=args.remeasure_budget_s, fresh_workers=args.fresh_workers,
                                              max_rounds=args.remeasure_max_pairs,
                                              settle_by_backend=args.settle_by_backend),
                  base_checkout=args.base_checkout, base_python=args.base_python)
    out = Path(args.out) if args.out else new / f"compare-vs-{base.name}"
    files = write_report(comparison, out)
    print(terminal_table(comparison))
    undecided = comparison.undecided
    if len(undecided) and not comparison.regression:
        print(undecided_advice(undecided, args, comparison.remeasure_next))
    print("wrote " + ", ".join(str(p) for p in files.values()))
    return comparison.exit_code(args.fail_on_undecided)


def undecided_advice(undecided, args: argparse.Namespace, remeasure_next: str = "") -> str:
    """What the undecided keys need, in words: --remeasure for keys only the runs judged; after a re-measurement
    the next step it has not taken (budget.next_step: the budget, a quieter machine, fewer keys) and each key's
    own reason - never the command just run."""
    again = "" if args.fail_on_undecided else " (not failing the gate: --no-fail-on-undecided)"
    fresh = undecided[~undecided.remeasured.astype(bool)]
    lines = []
    if args.remeasure:
        lines.append(f"next: {remeasure_next or 'each row of compare.csv says what its key would need'}" + again)
    elif len(fresh):
        keys = ", ".join(f"{r.backend} {r.case_id} [{r.phase}]" for r in fresh.head(5).itertuples())
        more = f" and {len(fresh) - 5} more" if len(fresh) > 5 else ""
        lines.append(f"undecided: {keys}{more}. Re-measure them here: compare {args.base} {args.new} --remeasure "
                     "(in the new run's checkout; it times base and new code in pairs), or run both sides with "
                     "more --rounds" + again)
    done = undecided[undecided.remeasured.astype(bool)]
    for r in done.head(5).itertuples():
        lines.append(f"undecided after re-measurement: {r.backend} {r.case_id} [{r.phase}]: {r.note}" + again)
    if len(done) > 5:
        lines.append(f"... and {len(done) - 5} more undecided after re-measurement (compare.csv says why)")
    return "\n".join(lines)


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser(
        "compare", help="the regression gate between two runs: exit 0 ok, 1 regression, 3 undecided, 2 bad input",
        description=__doc__.split("\n\n", 1)[1])
    p.add_argument("base", help="base run dir (or run id under --results-dir)")
    p.add_argument("new", help="new run dir (or run id under --results-dir)")
    add_to_argparse(p, *COMPARE_THRESHOLDS)
    p.add_argument("--remeasure", action="store_true",
                   help="re-time the slower and undecided keys with the base and the new code in pairs (the new "
                        "code is this checkout: the new run's), until each is decided or the budget ends")
    p.add_argument("--remeasure-budget-s", type=positive_float, default=RemeasureConfig.budget_s,
                   help="time budget of --remeasure in seconds (default: sized from the base run's own round times "
                        "and the load now, at most its benchmark stage - or two paired rounds of every suspect, up to "
                        "1.5x it; 120 s for a run that does not record it)")
    p.add_argument("--no-settle-by-backend", dest="settle_by_backend", action="store_false",
                   help="with --remeasure: time every suspect key until its own pairs decide it, even once its "
                        "backend's keys pooled have decided the backend (the backends still fail the gate)")
    p.add_argument("--remeasure-max-pairs", type=int, default=RemeasureConfig.max_rounds,
                   help="with --remeasure: at most this many pairs per key (default: %(default)s; raised to what the "
                        "family level needs when many keys are re-measured)")
    p.add_argument("--base-checkout", default=None,
                   help="with --remeasure: a checkout of the base run's commit (e.g. `git worktree add DIR BASE`); its "
                        "code is timed in pairs with the new code (default: this checkout when the base run was made "
                        "by the same clean commit and versions, else the new side alone)")
    p.add_argument("--base-python", default=None,
                   help="with --base-checkout: the python of the base side's environment (default: this one)")
    p.add_argument("--fresh-workers", action="store_true",
                   help="with --remeasure: new worker processes every round (slower; off: workers kept per side)")
    p.add_argument("--fail-on-undecided", action=argparse.BooleanOptionalAction, default=True,
                   help="undecided keys fail the gate with exit 3 (default); --no-fail-on-undecided: exit 0")
    p.add_argument("--allow-missing", action="store_true",
                   help="keys of the base run missing from the new one do not fail the gate (a deliberate subset)")
    p.add_argument("--noise", default=None,
                   help="noise model file (default: NOISE_DIR/<testbed>.json beside the base run, when present)")
    p.add_argument("--no-noise-model", action="store_false", dest="noise_model",
                   help="ignore any stored noise model: every key's margin is --min-effect")
    p.add_argument("--cross-device", action="store_true",
                   help="allow runs from different testbeds: a cross-device report, not a gate (exit 0)")
    p.add_argument("--out", default=None, help="report directory (default: NEW/compare-vs-BASE)")
    add_to_argparse(p, "results_dir")
    p.set_defaults(func=_compare)
