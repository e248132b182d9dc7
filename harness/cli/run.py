"""`python -m harness run` (the suites sharded over GPUs, CPU processes or Slurm, merged) and `merge` (Slurm's)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.cli.options import add_to_argparse, positive_int


def _run(args: argparse.Namespace) -> int:
    from harness.launch.local import gpu_devices, run_local
    from harness.launch.merge import ShardFailed
    try:
        if args.slurm is not None:
            from harness.launch.slurm import submit
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
    from harness.launch.merge import ShardFailed, merge_shards
    try:
        df = merge_shards(args.run_dir, args.shards, allow_mixed_testbeds=args.allow_mixed_testbeds)
    except ShardFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    _print_statuses(df)
    print(f"results: {Path(args.run_dir) / 'results.csv'} ({len(df)} rows)")
    return 0


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser(
        "run", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="run pytest suites sharded over several GPUs, CPU processes or Slurm tasks, merged into one run dir",
        description="Pytest options go after '--', e.g. python -m harness run --gpus all -- --matrix default "
                    "--benchmark. Exit: 0 all passed, 1 some test failed, 2 bad input, 3 a shard did not complete.")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--gpus", help="'all' or GPU indices like 0,1: one pytest process per GPU")
    where.add_argument("--cpu-shards", type=positive_int, help="N pytest processes on CPU (cores split between them)")
    where.add_argument("--slurm", type=int, metavar="N", help="N shards as a Slurm job array (submitit)")
    add_to_argparse(p, "results_dir")
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
