"""`python -m harness selftest --gpu`: the GPU acceptance run - every GPU path once, within a time budget, one
summary table.

Steps (each a subprocess, so one that crashes or hangs does not end the others; harness/cli/node/selftest_plan.py), most
informative first: which backends loaded; the real-CUDA tests (tests/gpu); correctness on the gpu-smoke matrix for
every available backend; one benchmark round; timing fidelity against triton's do_bench; the benchmark with
--cuda-graph on a subset; correctness on cuda:1 when a second GPU exists; the multi-GPU launcher (`run --gpus all`)
on a subset. `--budget-s` plans them to fit, each with its own timeout; the steps that do not fit are listed as not
run. The table is rewritten on disk as each step ends, so a run killed at any moment leaves the table of what
finished and of what did not run. Exit 1 when any step hit a harness error (a crashed or timed-out step, a failing
harness test, an `error` row of a built-in backend); a backend that fails a case is a result, listed, not a harness
error. Below the table: where each run's time went (its env.json time_spent: harness.measure.stages), so a slow step
says which stage to look at.

--dry-run runs the same steps on the CPU (smoke matrix, naive and sdpa, CPU launcher shards; the CUDA-only
steps are listed as skipped): what CI runs, so the command itself cannot rot.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from harness.backends.registry import built_in_names
from harness.cli.options import positive_float
from harness.cli.node.selftest_plan import STEP_KEYS, SUBSET, Step, choose, fit, steps, timeout_for
from harness.measure.stages import time_lines
from harness.store.environment import REPO_ROOT
from harness.store.schema import BASELINE, ERROR, UNAVAILABLE

#: the table, rewritten as each step ends, and the archive of everything a person needs to read the run
TABLE, ARCHIVE, OUTCOMES = "selftest-table.txt", "selftest.tgz", "selftest.json"


def _rows_summary(results: Path) -> tuple[str, int]:
    """(pass/fail/... counts of the step's rows, harness errors: error rows of built-in backends, and naive rows
    that did not run - naive needs nothing but torch, so 'unavailable' there is the harness's failure)."""
    import pandas as pd
    csvs = sorted(results.glob("*/results.csv")) if results.exists() else []
    if not csvs:
        return "no results", 1
    df = pd.concat([pd.read_csv(c) for c in csvs], ignore_index=True)
    counts = df.status.value_counts().to_dict()
    errors = df[((df.status == ERROR) & df.backend.isin(built_in_names()))
                | ((df.backend == BASELINE) & (df.status == UNAVAILABLE))]
    return ", ".join(f"{k} {v}" for k, v in counts.items()), len(errors)


def _time_spent(results: Path | None) -> list[tuple[str, dict]]:
    """(run directory relative to the step's results, its time_spent) for every run the step made (shards too)."""
    envs = sorted(results.glob("**/env.json")) if results is not None and results.exists() else []
    spent = [(str(env.parent.relative_to(results)), json.loads(env.read_text()).get("time_spent")) for env in envs]
    return [(run, used) for run, used in spent if used]


def _run(command: list[str], timeout_s: float) -> tuple[int | None, str]:
    """(exit code or None when killed at its timeout, stdout + stderr). The step runs in its own process group,
    so a timeout ends its workers too (pytest's backend workers, the launcher's shards)."""
    proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=max(timeout_s, 1.0))
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # SIGTERM not enough (a kernel that does not return)
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        return None, out


def run_step(step: Step, log, work: Path, timeout_s: float) -> dict:
    """Run one step for at most `timeout_s`; output to <work>/<step>.log, a failing step's last lines to `log`."""
    if step.skip:
        return {"status": "skipped" if not step.skip.startswith("not run") else "not run", "seconds": 0.0,
                "detail": step.skip}
    start = time.monotonic()
    code, output = _run(step.command, timeout_s)
    seconds = time.monotonic() - start
    log_file = work / ("step-" + "".join(c if c.isalnum() else "-" for c in step.name).strip("-") + ".log")
    log_file.write_text(f"$ {' '.join(step.command)}\n(timeout {timeout_s:.0f} s)\n{output}")
    tail = output.strip().splitlines()
    detail = step.summarize(output) if step.summarize else (tail[-1][:120] if tail else "")
    status = (f"TIMEOUT ({timeout_s:.0f} s)" if code is None
              else "ok" if code in step.ok_codes else f"FAILED (exit {code})")
    if step.results is not None:  # a step stopped at its timeout leaves the rows it finished: those are its result
        rows, errors = _rows_summary(step.results)
        detail = rows + (f"; {errors} error row(s) of built-in backends" if errors and rows != "no results" else "")
        if errors and code is not None:
            status = "FAILED (error rows)"
    log(f"[{step.name}] {status} in {seconds:.0f} s: {detail}")
    if status != "ok":
        log("\n".join(tail[-30:]) + f"\n(whole output: {log_file})")
    return {"status": status, "seconds": seconds, "detail": detail, "timeout_s": timeout_s}


def table(planned: list[Step], title: str) -> str:
    """The summary: one line per step (status, seconds, detail; 'pending' before it ran), then those not run."""
    width = max(len(s.name) for s in planned)
    lines = [title]
    for s in planned:
        o = s.outcome or ({"status": "not run" if s.skip.startswith("not run") else "skipped", "seconds": 0.0,
                           "detail": s.skip} if s.skip else
                          {"status": "pending", "seconds": 0.0, "detail": "not run when this table was written"})
        lines.append(f"  {s.name:<{width}}  {o['status']:<22} {o['seconds']:6.0f} s  {o['detail']}")
    not_run = [s.name for s in planned if s.outcome.get("status") == "not run" or not s.outcome
               and not (s.skip and not s.skip.startswith("not run"))]
    lines.append(f"not run: {', '.join(not_run)}" if not_run else "every planned step ran")
    return "\n".join(lines) + "\n"


def write_record(out: Path, work: Path, planned: list[Step], title: str) -> None:
    """The table (out/selftest-table.txt), every step's outcome (selftest.json) and the archive (selftest.tgz:
    both, each step's log, and env.json and results.csv of each run), each replaced whole (write, then rename)."""
    outcomes = json.dumps({s.name: s.outcome or {"status": "pending"} for s in planned}, indent=1)
    for name, content in ((TABLE, table(planned, title)), (OUTCOMES, outcomes)):
        (work / name).write_text(content)
        (out / f".{name}.tmp").write_text(content)
        (out / f".{name}.tmp").replace(out / name)
    members = [work / TABLE, work / OUTCOMES, *sorted(work.glob("*.log")), *sorted(work.glob("**/env.json")),
               *sorted(work.glob("**/results.csv"))]
    partial = out / f".{ARCHIVE}.tmp"
    with tarfile.open(partial, "w:gz") as tar:
        for path in members:
            tar.add(path, arcname=str(path.relative_to(work)))
    partial.replace(out / ARCHIVE)


def _available(names: str, device: str) -> list[str]:
    """The built-in (or named) backends that can run on `device`, in registry order."""
    from harness.backends.registry import get_backends
    from harness.cli.backends import describe
    from harness.calls.device import resolve_device
    dev = resolve_device(device)
    return [name for name, (_, reason, _) in describe(get_backends(names), dev).items() if reason is None]


def gpu_matrix_estimate() -> str:
    """One line: what the GPU main job (`gpu`) would take on an H200, by the cost model at its measured rates."""
    from harness.planning.fitted import H200, H200_BACKENDS, H200_ROUNDS, run_estimate
    from harness.cases.matrices import build_matrix
    cases = build_matrix("gpu")
    extrapolated = "; its unit costs partly extrapolated: docs/gpu.md" if H200.extrapolated else ""
    return (f"the gpu matrix on an H200 (its measured rates, {len(H200_BACKENDS)} backends, {H200_ROUNDS} rounds): "
            f"{len(cases)} cases, ~{run_estimate(cases) / 60:.1f} min (harness.planning.fitted.run_estimate"
            f"{extrapolated})")


def _selftest(args: argparse.Namespace) -> int:
    if not args.gpu:
        raise ValueError("selftest needs --gpu (the GPU acceptance run; --gpu --dry-run for its CPU stand-in)")
    import torch
    if not args.dry_run and not torch.cuda.is_available():
        raise ValueError("selftest --gpu needs a CUDA device (torch sees none); --dry-run runs the CPU stand-in")
    start = time.monotonic()
    out = Path(args.out or tempfile.mkdtemp(prefix="harness-selftest-"))
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = args.backends or (",".join(SUBSET) if args.dry_run else "all")
    backends = _available(names, "cpu" if args.dry_run else "cuda")
    planned = steps(args.dry_run, work, gpus, backends)
    choose(planned, args.steps.split(",") if args.steps else None)
    fit(planned, args.budget_s)
    title = (f"selftest {'--dry-run (CPU stand-in)' if args.dry_run else 'on ' + torch.cuda.get_device_name(0)}: "
             f"budget {args.budget_s:.0f} s, backends {','.join(backends)}; results under {out}")
    print(gpu_matrix_estimate())
    print(f"plan ({args.budget_s:.0f} s):")
    for s in planned:
        print(f"  {s.name:<32} {'~%.0f s' % s.estimate_s if not s.skip else s.skip}")
    write_record(out, work, planned, title)
    for i, step in enumerate(planned):
        left = args.budget_s - (time.monotonic() - start)
        timeout = timeout_for(step, planned[i + 1:], left)
        if not step.skip and timeout < step.estimate_s / 2:
            step.skip = f"not run: budget spent ({left:.0f} s left, ~{step.estimate_s:.0f} s needed)"
        step.outcome = run_step(step, print, work, timeout)
        write_record(out, work, planned, title)
    spent = time.monotonic() - start
    print("\n" + table(planned, title + f" - {spent:.0f} s"), end="")
    print("\nwhere each run's time went (harness.measure.stages; env.json 'time_spent'):")
    for s in planned:
        for run, used in _time_spent(s.results):
            print(f"  {s.name} [{run}]")
            print("\n".join("    " + line for line in time_lines(used)))
            s.outcome.setdefault("time_spent", {})[run] = used
    write_record(out, work, planned, title + f" - {spent:.0f} s")
    print(f"table: {out / TABLE}; archive: {out / ARCHIVE}")
    failed = [s.name for s in planned if s.outcome["status"] not in ("ok", "skipped", "not run")]
    if failed:
        print(f"harness errors in: {', '.join(failed)}")
    return 1 if failed else 0


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser("selftest", help="the GPU acceptance run: every GPU path once, within a budget, one "
                                               "summary table", description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--gpu", action="store_true", help="run the GPU acceptance steps")
    p.add_argument("--dry-run", action="store_true", help="the same steps on the CPU (what CI runs)")
    p.add_argument("--budget-s", type=positive_float, default=480.0,
                   help="seconds the whole run may take: the steps are planned to fit, each with its own timeout. "
                        "Default: %(default)s")
    p.add_argument("--steps", default=None,
                   help=f"comma-separated steps to run (default: all that fit), of: {', '.join(STEP_KEYS)}")
    p.add_argument("--backends", default=None,
                   help="comma-separated backends for the correctness and benchmark steps (default: every one that "
                        f"can run here; --dry-run: {','.join(SUBSET)})")
    p.add_argument("--out", default=None,
                   help=f"where {TABLE}, {ARCHIVE} and {OUTCOMES} go, the steps' logs and results under its work/ "
                        "(default: a new temporary directory)")
    p.set_defaults(func=_selftest)
