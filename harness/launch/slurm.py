"""Run the shards of `pytest suites` as a Slurm job array through submitit, then merge them into one run dir."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Sequence

from harness.store.environment import new_run_id
from harness.launch.local import LaunchResult, check_pytest_args, shard_command
from harness.launch.merge import merge_shards, shard_root, write_exit_status
from harness.extras import missing


def run_shard_job(cmd: list[str], cwd: str, root: str) -> int:
    """Body of one array task: run its pytest shard in the submitting directory, log and exit status beside it."""
    with Path(root).with_suffix(".log").open("w") as f:
        rc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT).returncode
    write_exit_status(root, rc)
    return rc


def submit(pytest_args: Sequence[str], shards: int, *, results_dir: str | Path = "results", suites: str = "suites",
           cluster: str | None = None, partition: str | None = None, gpus_per_task: int = 1, cpus_per_task: int = 8,
           timeout_min: int = 120, array_parallelism: int | None = None,
           wait: bool = True) -> tuple[Path, list, LaunchResult | None]:
    """Submit `shards` array tasks, each `pytest suites ... --shard i/N` with its own --results-dir, run in the
    current directory: (run_dir, jobs, result); result is None when not waiting (`python -m harness merge` later)."""
    if shards < 1:
        raise ValueError(f"--slurm {shards!r}: the number of shards must be >= 1")
    pytest_args = check_pytest_args(pytest_args)
    run_dir = Path(results_dir).resolve() / new_run_id()
    try:
        import submitit
    except ImportError:
        raise missing("submitit", "--slurm") from None
    parameters = {"timeout_min": timeout_min, "nodes": 1, "tasks_per_node": 1, "cpus_per_task": cpus_per_task,
                  # the local executor would hand out GPUs this machine may not have; Slurm allocates them
                  "gpus_per_node": 0 if cluster in ("local", "debug") else gpus_per_task,
                  "name": f"harness-{run_dir.name}"}
    optional = {"slurm_partition": partition, "slurm_array_parallelism": array_parallelism}
    parameters.update({name: value for name, value in optional.items() if value})
    executor = submitit.AutoExecutor(folder=run_dir / "submitit", cluster=cluster)
    executor.update_parameters(**parameters)
    roots = [shard_root(run_dir, i, shards) for i in range(shards)]
    for root in roots:
        root.mkdir(parents=True)
    cmds = [shard_command(i, shards, pytest_args, root, suites=suites) for i, root in enumerate(roots)]
    jobs = executor.map_array(run_shard_job, cmds, [os.getcwd()] * shards, [str(root) for root in roots])
    print(f"submitted {shards} shards as {jobs[0].job_id.split('_')[0]} ({executor.cluster}); run dir {run_dir}",
          flush=True)
    if not wait:
        return run_dir, jobs, None
    returncodes = [job.result() for job in jobs]  # raises submitit's error, with the task's stderr, if a task died
    return run_dir, jobs, LaunchResult(run_dir, returncodes, merge_shards(run_dir, shards))
