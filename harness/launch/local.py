"""Run `pytest suites` as one process per GPU (or per CPU shard) on a shard of the cases each, then merge."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd

from harness.store.environment import new_run_id
from harness.store.host import smi_devices
from harness.launch.merge import merge_shards, shard_root, write_exit_status

#: options the launcher sets per shard; a user value would make shards overlap or collide
OWNED = ("--shard", "--results-dir", "--device")


def check_pytest_args(args: Sequence[str]) -> list[str]:
    """The pytest arguments to pass on (a leading '--' dropped); the launcher's own options are refused."""
    args = list(args)
    if args[:1] == ["--"]:
        args = args[1:]
    for arg in args:
        if arg.split("=", 1)[0] in OWNED:
            raise ValueError(f"pytest argument {arg!r}: the launcher sets {', '.join(OWNED)} for each shard; "
                             "use --gpus / --cpu-shards / --results-dir of `python -m harness run` instead")
    return args


def parse_gpus(spec: str, available: int) -> list[int]:
    """'all' or '0,2' -> GPU indices (as torch numbers them); a bad or absent index is a ValueError."""
    if available == 0:
        raise ValueError(f"--gpus {spec!r}: no CUDA device is visible to torch on this machine; "
                         "use --cpu-shards N to run the shards on CPU")
    if spec.strip() == "all":
        return list(range(available))
    try:
        gpus = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--gpus {spec!r}: expected 'all' or comma-separated indices, e.g. 0,1") from None
    bad = [g for g in gpus if not 0 <= g < available]
    if not gpus or bad or len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus {spec!r}: allowed: 'all' or distinct indices in 0..{available - 1}")
    return gpus


def shard_command(index: int, count: int, pytest_args: Sequence[str], results_root: Path, *,
                  device: str | None = None, suites: str = "suites") -> list[str]:
    """The pytest command line of shard `index` of `count`."""
    # -p no:cacheprovider: N processes writing one .pytest_cache at once would race for nothing.
    cmd = [sys.executable, "-m", "pytest", suites, "-p", "no:cacheprovider", *pytest_args,
           "--shard", f"{index}/{count}", "--results-dir", str(results_root)]
    return cmd + (["--device", device] if device else [])


@dataclass
class LaunchResult:
    run_dir: Path
    returncodes: list[int]
    results: pd.DataFrame

    @property
    def exit_code(self) -> int:
        """1 when any shard had failing tests, else 0 (as a single pytest run would exit)."""
        return 1 if 1 in self.returncodes else 0


def run_local(pytest_args: Sequence[str], devices: Sequence[str], *, results_dir: str | Path = "results",
              suites: str = "suites", cuda_visible: Sequence[str | None] | None = None) -> LaunchResult:
    """One pytest process per entry of `devices` ('cpu' or 'cuda:0'), all at once, merged into one run dir;
    `cuda_visible[i]` is shard i's CUDA_VISIBLE_DEVICES (its GPU alone, as cuda:0)."""
    pytest_args = check_pytest_args(pytest_args)
    count = len(devices)
    run_dir = Path(results_dir) / new_run_id()
    # the host's cores split between the shards, so they do not oversubscribe
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // count))
    procs = []
    try:
        for i, device in enumerate(devices):
            root = shard_root(run_dir, i, count)
            root.mkdir(parents=True)
            env = {**os.environ, "OMP_NUM_THREADS": threads}
            if cuda_visible is not None and cuda_visible[i] is not None:
                env["CUDA_VISIBLE_DEVICES"] = cuda_visible[i]
            log = root.with_suffix(".log")
            with log.open("w") as out:
                procs.append(subprocess.Popen(shard_command(i, count, pytest_args, root, device=device, suites=suites),
                                              stdout=out, stderr=subprocess.STDOUT, env=env))
            print(f"shard {i}/{count} on {device}: pid {procs[-1].pid}, log {log}", flush=True)
        returncodes = []
        for i, proc in enumerate(procs):
            returncodes.append(proc.wait())
            write_exit_status(shard_root(run_dir, i, count), returncodes[-1])
            print(f"shard {i}/{count} exited {returncodes[-1]}", flush=True)
    except BaseException:
        for proc in procs:  # only the processes started here; an interrupted launcher leaves no orphans
            if proc.poll() is None:
                proc.terminate()
        raise
    return LaunchResult(run_dir, returncodes, merge_shards(run_dir, count))


def gpu_devices(spec: str, listing: str | None = None) -> tuple[list[str], list[str]]:
    """(devices, CUDA_VISIBLE_DEVICES per shard) for --gpus, honouring a CUDA_VISIBLE_DEVICES already set; under MIG
    (a process sees one instance) the shards are the MIG instances nvidia-smi lists, each given by UUID."""
    import torch

    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    migs = [uuid for _, uuid in smi_devices(listing) if uuid.startswith("MIG-")] if not parent else []
    if migs:
        picked = parse_gpus(spec, len(migs))
        return ["cuda:0"] * len(picked), [migs[i] for i in picked]
    gpus = parse_gpus(spec, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    visible = [x.strip() for x in parent.split(",")] if parent else [str(g) for g in range(max(gpus) + 1)]
    return ["cuda:0"] * len(gpus), [visible[g] for g in gpus]
