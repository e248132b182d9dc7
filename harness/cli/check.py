"""`python -m harness check`: verdicts of backends on a matrix, a summary per backend, exit 1 on any failure."""

from __future__ import annotations

import argparse
import shlex

from harness.cli.options import add_to_argparse
from harness.store.schema import FAILING


def _check(args: argparse.Namespace) -> int:
    from harness.api import check_in_session
    from harness.backends.registry import get_backends, load_backend_module
    from harness.execution.cost import check_cost
    from harness.execution.device import resolve_device
    from harness.execution.session import RunSession
    from harness.spec.matrices import build_matrix, resolve_matrix
    from harness.spec.presets import quick_cases
    from harness.store.run_dir import results_root
    from harness.oracle.signatures import signature
    from harness.store.schema import NOT_RUN, worst_status
    for module in args.backend_module:
        load_backend_module(module, here=not args.isolate)  # imported here only with --no-isolate
    backends = get_backends(args.backends)  # a misspelled name is refused before a run folder is made
    device = resolve_device(args.device)
    cases = quick_cases(args.preset, args.hf_config, batch=args.batch, seq=args.seq)
    if cases is not None and args.matrix != "smoke":
        raise ValueError(f"--matrix {args.matrix} and --preset/--hf-config both choose the cases; give one")
    matrix = resolve_matrix(args.matrix, device.type)
    cases = cases if cases is not None else build_matrix(matrix)
    check_cost(cases, device, allow=args.allow_expensive)
    results_root(args.results_dir)  # a results dir that is a file or cannot be written is refused in one line
    # a run folder like the suites', built the same way: `python -m harness report` and `compare` take it
    session = RunSession.from_options(args, device, cases, matrix)
    session.enter_stage("correctness")  # check's one stage, named as the suites name it
    path = session.writer.path
    df = check_in_session(session, backends, cases)
    per_case = df.groupby(["backend", "case_id"]).status.agg(worst_status)
    summary = per_case.groupby(level=0).value_counts().unstack(fill_value=0)
    print(f"integrity: {session.executor.integrity}")
    print(summary.to_string())
    bad = df[df.status.isin(FAILING)]
    for row in bad.itertuples():
        words = signature(row.reason)  # a known cheat's signature, in plain words
        print(f"{row.status.upper()} {row.backend} {row.case_id} [{row.phase}]: {row.reason}"
              + (f" (looks like a known cheat: {words})" if words else ""))
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
    add_to_argparse(p, "backends", "backend_module", "matrix", "preset", "hf_config", "batch", "seq", "device",
                    "results_dir", "seed", "no_isolate", "call_timeout_s", "allow_expensive",
                    defaults={"matrix": "smoke"})
    p.set_defaults(func=_check)
