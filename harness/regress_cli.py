"""Subcommands `history`, `compare`, `run` and `merge` of `python -m harness` (registered via SUBCOMMAND_MODULES)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness import compare as cmp


def _resolve_run(arg: str, results_dir: str) -> Path:
    """A run dir path, or a run id under results_dir."""
    for path in (Path(arg), Path(results_dir) / arg):
        if (path / "results.csv").exists():
            return path
    raise FileNotFoundError(f"run {arg!r}: no results.csv there nor under {results_dir}/{arg}")


def _history(args: argparse.Namespace) -> int:
    from harness.history import history_text, load_history

    print(history_text(load_history(args.results_dir)))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from harness.compare_report import terminal_table, write_report

    base, new = _resolve_run(args.base, args.results_dir), _resolve_run(args.new, args.results_dir)
    df = cmp.compare_runs(base, new, min_effect=args.min_effect, alpha=args.alpha, abs_floor_ms=args.abs_floor_ms,
                          err_growth=args.err_growth, min_samples=args.min_samples, round_alpha=args.round_alpha,
                          cross_device=args.cross_device)
    out = Path(args.out) if args.out else new / f"compare-vs-{base.name}"
    files = write_report(df, out)
    print(terminal_table(df))
    print("wrote " + ", ".join(str(p) for p in files.values()))
    return 1 if cmp.has_regression(df) else 0


def _run(args: argparse.Namespace) -> int:
    from harness.launch import gpu_devices, run_local
    from harness.merge import ShardFailed

    try:
        if args.slurm is not None:
            from harness.slurm import submit

            run_dir, _, result = submit(args.pytest_args, args.slurm, results_dir=args.results_dir,
                                        suites=args.suites, cluster=args.slurm_cluster, partition=args.slurm_partition,
                                        gpus_per_task=args.slurm_gpus_per_task, cpus_per_task=args.slurm_cpus_per_task,
                                        timeout_min=args.slurm_time_min, array_parallelism=args.slurm_parallelism,
                                        wait=not args.no_wait)
            if result is None:
                print(f"not waiting; when the array is done: python -m harness merge {run_dir}")
                return 0
        elif args.gpus is not None:
            devices, visible = gpu_devices(args.gpus)
            result = run_local(args.pytest_args, devices, results_dir=args.results_dir, suites=args.suites,
                               cuda_visible=visible)
        else:
            if args.cpu_shards < 1:
                raise ValueError(f"--cpu-shards {args.cpu_shards!r}: must be >= 1")
            result = run_local(args.pytest_args, ["cpu"] * args.cpu_shards, results_dir=args.results_dir,
                               suites=args.suites)
    except ShardFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    _print_statuses(result.results)
    print(f"results: {result.run_dir / 'results.csv'} ({len(result.results)} rows from "
          f"{len(result.returncodes)} shards)")
    return result.exit_code


def _print_statuses(df) -> None:
    if len(df):
        print(df.groupby("backend").status.value_counts().unstack(fill_value=0).to_string())


def _merge(args: argparse.Namespace) -> int:
    from harness.merge import ShardFailed, merge_shards

    try:
        df = merge_shards(args.run_dir, args.shards, allow_mixed_testbeds=args.allow_mixed_testbeds)
    except ShardFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    _print_statuses(df)
    print(f"results: {Path(args.run_dir) / 'results.csv'} ({len(df)} rows)")
    return 0


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser("history", help="summarize every run under a results directory")
    p.add_argument("results_dir", nargs="?", default="results", help="directory of run dirs (default: results)")
    p.set_defaults(func=_history)

    p = subparsers.add_parser("compare", help="compare two runs per (case, backend, phase); exit 1 on a regression",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("base", help="base run dir (or run id under --results-dir)")
    p.add_argument("new", help="new run dir (or run id under --results-dir)")
    p.add_argument("--min-effect", type=float, default=cmp.MIN_EFFECT, help="smallest median ratio change that counts")
    p.add_argument("--alpha", type=float, default=cmp.ALPHA, help="Mann-Whitney U significance level")
    p.add_argument("--abs-floor-ms", type=float, default=cmp.ABS_FLOOR_MS,
                   help="smallest median change (ms) that counts")
    p.add_argument("--err-growth", type=float, default=cmp.ERR_GROWTH, help="err_ratio increase flagged as worse")
    p.add_argument("--min-samples", type=int, default=cmp.MIN_SAMPLES, help="fewest samples per side for a verdict")
    p.add_argument("--round-alpha", type=float, default=cmp.ROUND_ALPHA,
                   help="significance level of the t-test on round medians (runs with >= 2 rounds a side)")
    p.add_argument("--cross-device", action="store_true",
                   help="allow runs from different testbeds: a cross-device report, not a gate (exit 0)")
    p.add_argument("--out", default=None, help="report directory (default: NEW/compare-vs-BASE)")
    p.add_argument("--results-dir", default="results", help="where bare run ids are looked up")
    p.set_defaults(func=_compare)

    p = subparsers.add_parser(
        "run", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="run pytest suites sharded over several GPUs, CPU processes or Slurm tasks, merged into one run dir",
        description="Pytest options go after '--', e.g. python -m harness run --gpus all -- --matrix default "
                    "--benchmark. Exit: 0 all passed, 1 some test failed, 2 bad input, 3 a shard did not complete.")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--gpus", help="'all' or GPU indices like 0,1: one pytest process per GPU")
    where.add_argument("--cpu-shards", type=int, help="N pytest processes on CPU (cores split between them)")
    where.add_argument("--slurm", type=int, metavar="N", help="N shards as a Slurm job array (submitit)")
    p.add_argument("--results-dir", default="results", help="where the merged run dir goes")
    p.add_argument("--suites", default="suites", help="pytest path of the suites")
    g = p.add_argument_group("slurm (with --slurm)")
    g.add_argument("--slurm-cluster", default=None, choices=["slurm", "local", "debug"],
                   help="submitit executor; 'local' runs the array as local processes (default: auto)")
    g.add_argument("--slurm-partition", default=None)
    g.add_argument("--slurm-gpus-per-task", type=int, default=1)
    g.add_argument("--slurm-cpus-per-task", type=int, default=8)
    g.add_argument("--slurm-time-min", type=int, default=120)
    g.add_argument("--slurm-parallelism", type=int, default=None, help="max array tasks running at once")
    g.add_argument("--no-wait", action="store_true", help="submit and exit; merge later with `harness merge`")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="'--' then options for pytest suites")
    p.set_defaults(func=_run)

    p = subparsers.add_parser("merge", help="merge RUN_DIR/shards/* into RUN_DIR (after `run --slurm N --no-wait`)")
    p.add_argument("run_dir")
    p.add_argument("--shards", type=int, default=None, help="require exactly this many shards")
    p.add_argument("--allow-mixed-testbeds", action="store_true")
    p.set_defaults(func=_merge)
