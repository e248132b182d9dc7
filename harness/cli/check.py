"""`python -m harness check`: verdicts of backends on a matrix (or named cases, or fuzzed ones), a summary per
backend, each failure's repro command, exit 1 on any failure."""

from __future__ import annotations

import argparse
import shlex
import sys

from harness.cli.options import add_to_argparse
from harness.store.schema import FAILING


def _cases(args: argparse.Namespace, device):
    """(cases, matrix label) from --case, --preset/--hf-config or --matrix (one of them); None cases with --fuzz."""
    from harness.cases.case import AttentionCase
    from harness.cases.matrices import FUZZ, build_matrix, resolve_matrix
    from harness.cases.presets import quick_cases
    cases = quick_cases(args.preset, args.hf_config, batch=args.batch, seq=args.seq)
    args.fuzz = args.fuzz or args.matrix == FUZZ
    chosen = [flag for flag, given in ((f"--matrix {args.matrix}", args.matrix not in ("smoke", FUZZ)),
                                       ("--preset/--hf-config", cases is not None), ("--case", args.case),
                                       ("--fuzz", args.fuzz)) if given]
    if len(chosen) > 1:
        raise ValueError(f"{' and '.join(chosen)} {'both' if len(chosen) == 2 else 'each'} choose the cases; "
                         "give one")
    matrix = resolve_matrix(args.matrix if not args.fuzz else FUZZ, device.type)
    if args.case:
        return [AttentionCase.from_id(text) for text in dict.fromkeys(args.case)], "cases"
    if args.fuzz:
        return None, matrix
    return (cases if cases is not None else build_matrix(matrix)), matrix


def _check(args: argparse.Namespace) -> int:
    from harness.api import check_in_session
    from harness.backends.registry import get_backends
    from harness.isolation.plugin_host import load_backend_module
    from harness.cli.backends import available_here
    from harness.planning.cost import Job, check_cost
    from harness.calls.device import resolve_device
    from harness.fuzzing.fuzz import fuzz_in_session, plan, summary_lines
    from harness.run.session import RunSession, run_seed
    from harness.oracle.signatures import signature
    from harness.store.run_dir import results_root
    from harness.store.schema import NOT_RUN, worst_status
    for module in args.backend_module:
        load_backend_module(module, here=not args.isolate)  # imported here only with --no-isolate
    backends = get_backends(args.backends)  # a misspelled name is refused before a run folder is made
    device = resolve_device(args.device)
    cases, matrix = _cases(args, device)
    planned = None
    here = available_here(backends, device)  # asked in workers: no backend library loads here
    if args.fuzz:  # the draw is the seed's: fix it before the session, which records it
        args.seed = run_seed(args.seed)
        planned = plan(here, device, args.seed, args.fuzz_budget_s)
        cases = [p.case for p in planned]
        if not cases:
            raise ValueError(f"--fuzz drew no case that {', '.join(b.name for b in backends)} take on {device} "
                             f"within --fuzz-budget-s {args.fuzz_budget_s:g}")
    # the whole estimate on stderr, where the longer commands print their progress: stdout keeps the verdicts
    print(check_cost(cases, device, Job(tuple(here)), allow=args.allow_expensive).summary(), file=sys.stderr)
    results_root(args.results_dir)  # a results dir that is a file or cannot be written is refused in one line
    # a run folder like the suites', built the same way: `python -m harness report` and `compare` take it
    session = RunSession.from_options(args, device, cases, matrix)
    session.enter_stage("correctness")  # check's one stage, named as the suites name it
    path = session.writer.path
    if planned is not None:
        df, run = fuzz_in_session(session, backends, planned, args.fuzz_budget_s)
    else:
        df, run = check_in_session(session, backends, cases), None
    per_case = df.groupby(["backend", "case_id"]).status.agg(worst_status)
    summary = per_case.groupby(level=0).value_counts().unstack(fill_value=0)
    print(f"integrity: {session.executor.integrity}")
    print(summary.to_string())
    bad = df[df.status.isin(FAILING)]
    if run is not None:  # a fuzz run's failures, once each, at their smallest
        print("\n".join(summary_lines(run)))
    else:
        for row in bad.itertuples():
            words = signature(row.reason)  # a known cheat's signature, in plain words
            print(f"{row.status.upper()} {row.backend} {row.case_id} [{row.phase}]: {row.reason}"
                  + (f" (looks like a known cheat: {words})" if words else ""))
        for command in dict.fromkeys(bad.repro.dropna()):
            print(f"  rerun: {command}")
    not_run = df[df.status.isin(NOT_RUN)].drop_duplicates(["backend", "status", "reason"])
    if len(not_run):  # what did not load or run here, and why: e.g. `check --backends xformers,flash-attn`
        width = max(map(len, not_run.backend))
        print("not run:")
        for row in not_run.itertuples():
            print(f"  {row.backend:<{width}}  {row.status:<11}  {row.reason}")
    print(f"results: {path}  (python -m harness report {shlex.quote(str(path.parent))} draws it)")
    return 1 if len(bad) else 0


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser("check", help="check backends for correctness; exit 1 when any case fails")
    # check answers "is it correct?" quickly: the smoke matrix by default, or small cases of a model's shape
    add_to_argparse(p, "backends", "backend_module", "matrix", "case", "fuzz", "fuzz_budget_s", "preset", "hf_config",
                    "batch", "seq", "device", "results_dir", "seed", "no_isolate", "call_timeout_s",
                    "allow_expensive", defaults={"matrix": "smoke"})
    p.set_defaults(func=_check)
