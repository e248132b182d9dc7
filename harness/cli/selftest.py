"""`python -m harness selftest --gpu`: the GPU acceptance run - every GPU path once, one summary table.

Steps (each a subprocess, so one that crashes does not end the others): which backends loaded; the real-CUDA
tests (tests/gpu); the suites on the gpu-smoke matrix with --benchmark (CUDA events, and the timing-fidelity
row against triton's do_bench); the benchmark with --cuda-graph; correctness on cuda:1 when a second GPU exists;
memory growth (naive ~ n^2, fused ~ n); the multi-GPU launcher (`run --gpus all`). Exit 1 when any step hit a
harness error (a crashed step, a failing harness test, an `error` row of a built-in backend); a backend that
fails a case is a result, listed, not a harness error. Below the table: where each run's time went (its
env.json time_spent: harness.measure.stages), so a slow step says which stage to look at.

--dry-run runs the same steps on the CPU (smoke matrix, CPU launcher shards; the CUDA-only steps are listed as
skipped): what CI runs, so the command itself cannot rot.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness.measure.stages import time_lines

ROOT = Path(__file__).resolve().parents[2]
BUILT_IN = ("naive", "sdpa", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flex", "xformers",
            "flash-attn")
#: pytest exit codes that are results (0 all passed, 1 some tests failed: a backend failing a case)
PYTEST_RESULTS = (0, 1)


@dataclass
class Step:
    name: str
    command: list[str]
    #: exit codes that mean the step ran as designed
    ok_codes: tuple[int, ...] = (0,)
    #: the results directory whose rows the step's summary reads
    results: Path | None = None
    skip: str = ""
    #: the table's detail from the step's stdout (default: its last line)
    summarize: Callable[[str], str] | None = None
    outcome: dict = field(default_factory=dict)


def _py(*args: str) -> list[str]:
    return [sys.executable, *args]


def plan(dry_run: bool, out: Path, gpus: int) -> list[Step]:
    """The steps on a GPU, or their CPU stand-ins for --dry-run."""
    device, matrix = ("cpu", "smoke") if dry_run else ("cuda", "gpu-smoke")
    # the dry run keeps to two quick backends: it proves the steps, CI pays for it, and flex compiles for minutes
    quick = ["--backends", "naive,sdpa"] if dry_run else []
    # one measurement round: the acceptance run proves the paths; rounds are for compare (an H200 took ~2 min a
    # round of gpu-smoke with seven backends)
    suites = ["-m", "pytest", "suites", "--device", device, "--matrix", matrix, "-q", "-p", "no:cacheprovider",
              "--benchmark-quiet", "--no-report", "--rounds", "1", *quick]
    no_gpu = "dry run: needs a CUDA device" if dry_run else ""
    steps = [
        Step("backends", _py("-m", "harness", "backends", "--device", device), summarize=_backends_summary),
        # the check of every backend on gpu-smoke is the next step's correctness stage: not run twice
        Step("tests/gpu", _py("-m", "pytest", "tests/gpu", "-q", "-p", "no:cacheprovider", "-rs", "-k",
                              "not every_installed_backend"),
             ok_codes=(0, 5) if dry_run else (0,)),
        Step(f"suites {matrix} --benchmark", _py(*suites, "--benchmark", "--results-dir", str(out / "bench")),
             PYTEST_RESULTS, out / "bench"),
        Step("--cuda-graph", _py(*suites, "--benchmark", "--cuda-graph", "--results-dir", str(out / "graph"),
                                 *(["--backends", "sdpa,naive"] if not quick else [])), PYTEST_RESULTS, out / "graph",
             skip=no_gpu),
        Step("cuda:1", _py(*[a if a != "cuda" else "cuda:1" for a in suites], "--results-dir", str(out / "cuda1")),
             PYTEST_RESULTS, out / "cuda1",
             skip=no_gpu or ("" if gpus >= 2 else f"{gpus} CUDA device(s): cuda:1 needs two")),
        Step("memory growth", _py("-c", MEMORY_GROWTH.format(device=device))),
        Step("run --gpus all" if not dry_run else "run --cpu-shards 2",
             _py("-m", "harness", "run", *(["--cpu-shards", "2"] if dry_run else ["--gpus", "all"]),
                 "--results-dir", str(out / "launch"), "--", "--matrix", matrix, "--backends", "naive,sdpa", "-q",
                 "--no-report"), PYTEST_RESULTS, out / "launch"),
    ]
    return steps


#: peak memory of naive (materialized scores) and a fused kernel at doubling sequence lengths
MEMORY_GROWTH = """
import json, torch
from harness import AttentionCase
from harness.backends.registry import get_backends
from harness.execution.timed import phase_callables
from harness.measure.memory import peak_memory
from harness.spec.case import make_inputs
from harness.spec.masks import Causal
device = torch.device({device!r})
fused = "sdpa-flash" if device.type == "cuda" else "sdpa"
seqs = (2048, 4096) if device.type == "cuda" else (256, 512)
out = {{}}
for name in ("naive", fused):
    b = get_backends([name])[0]
    for s in seqs:
        case = AttentionCase(1, 16 if device.type == "cuda" else 4, s, 128 if device.type == "cuda" else 64,
                             "bf16" if device.type == "cuda" else "fp32", mask=Causal())
        p = phase_callables(b, case, make_inputs(case, device), device, "fwd")
        out[f"{{name}} s{{s}}"] = peak_memory(p.fn, device=device, setup=p.setup)[0]
naive = out[f"naive s{{seqs[1]}}"] / out[f"naive s{{seqs[0]}}"]
fused_r = out[f"{{fused}} s{{seqs[1]}}"] / max(out[f"{{fused}} s{{seqs[0]}}"], 1)
print(f"peak memory x{{naive:.2f}} for naive, x{{fused_r:.2f}} for {{fused}} when the sequence doubles")
ok = naive > 3.0 and fused_r < 2.6
raise SystemExit(0 if ok else 1)
"""


def _backends_summary(stdout: str) -> str:
    """'ok: naive, sdpa, ...; unavailable: xformers, flash-attn' from `harness backends`' lines
    ('  name  version  ok' or '... unavailable: why'); the reasons are in the step's log."""
    ok, not_ok = [], []
    for line in stdout.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 2 and fields[0] != "kernels:":
            (ok if line.rstrip().endswith(" ok") else not_ok).append(fields[0])
    return f"ok: {', '.join(ok) or '-'}; unavailable: {', '.join(not_ok) or '-'}"


def _rows_summary(results: Path) -> tuple[str, int]:
    """(pass/fail/... counts of the step's rows, harness errors: error rows of built-in backends, and naive rows
    that did not run - naive needs nothing but torch, so 'unavailable' there is the harness's failure)."""
    import pandas as pd

    csvs = sorted(results.glob("*/results.csv")) if results.exists() else []
    if not csvs:
        return "no results", 1
    df = pd.concat([pd.read_csv(c) for c in csvs], ignore_index=True)
    counts = df.status.value_counts().to_dict()
    errors = df[((df.status == "error") & df.backend.isin(BUILT_IN))
                | ((df.backend == "naive") & (df.status == "unavailable"))]
    return ", ".join(f"{k} {v}" for k, v in counts.items()), len(errors)


def _time_spent(results: Path | None) -> list[tuple[str, dict]]:
    """(run directory relative to the step's results, its time_spent) for every run the step made (a launcher's
    shards each have their own)."""
    if results is None or not results.exists():
        return []
    found = []
    for env in sorted(results.glob("**/env.json")):
        spent = json.loads(env.read_text()).get("time_spent")
        if spent:
            found.append((str(env.parent.relative_to(results)), spent))
    return found


def run_step(step: Step, log, out: Path) -> dict:
    """Run one step; its whole output goes to <out>/<step>.log, a failing step's last lines to `log` too."""
    if step.skip:
        return {"status": "skipped", "seconds": 0.0, "detail": step.skip}
    start = time.monotonic()
    proc = subprocess.run(step.command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.monotonic() - start
    (out / f"{_file_name(step.name)}.log").write_text(f"$ {' '.join(step.command)}\n{proc.stdout}{proc.stderr}")
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    detail = step.summarize(proc.stdout) if step.summarize else (tail[-1][:120] if tail else "")
    status = "ok" if proc.returncode in step.ok_codes else f"FAILED (exit {proc.returncode})"
    if step.results is not None:
        rows, errors = _rows_summary(step.results)
        detail = rows + (f"; {errors} error row(s) of built-in backends" if errors else "")
        if errors:
            status = "FAILED (error rows)"
    log(f"[{step.name}] {status} in {seconds:.0f} s: {detail}")
    if status != "ok":
        log("\n".join(tail[-30:]) + f"\n(whole output: {out / _file_name(step.name)}.log)")
    return {"status": status, "seconds": seconds, "detail": detail}


def _file_name(step_name: str) -> str:
    return "step-" + "".join(c if c.isalnum() else "-" for c in step_name).strip("-")


def _selftest(args: argparse.Namespace) -> int:
    if not args.gpu:
        raise ValueError("selftest needs --gpu (the GPU acceptance run; --gpu --dry-run for its CPU stand-in)")
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        raise ValueError("selftest --gpu needs a CUDA device (torch sees none); --dry-run runs the CPU stand-in")
    out = Path(args.out or tempfile.mkdtemp(prefix="harness-selftest-"))
    out.mkdir(parents=True, exist_ok=True)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    steps = plan(args.dry_run, out, gpus)
    start = time.monotonic()
    for step in steps:
        step.outcome = run_step(step, print, out)
    width = max(len(s.name) for s in steps)
    print(f"\nselftest {'--dry-run (CPU stand-in)' if args.dry_run else 'on ' + torch.cuda.get_device_name(0)}: "
          f"{time.monotonic() - start:.0f} s, results under {out}")
    for s in steps:
        print(f"  {s.name:<{width}}  {s.outcome['status']:<22} {s.outcome['seconds']:6.0f} s  {s.outcome['detail']}")
    print("\nwhere each run's time went (harness.measure.stages; env.json 'time_spent'):")
    for s in steps:
        for run, spent in _time_spent(s.results):
            print(f"  {s.name} [{run}]")
            print("\n".join("    " + line for line in time_lines(spent)))
            s.outcome.setdefault("time_spent", {})[run] = spent
    (out / "selftest.json").write_text(json.dumps({s.name: s.outcome for s in steps}, indent=1))
    failed = [s.name for s in steps if s.outcome["status"] not in ("ok", "skipped")]
    if failed:
        print(f"harness errors in: {', '.join(failed)}")
    return 1 if failed else 0


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser("selftest", help="the GPU acceptance run: every GPU path once, one summary table",
                              description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--gpu", action="store_true", help="run the GPU acceptance steps")
    p.add_argument("--dry-run", action="store_true", help="the same steps on the CPU (what CI runs)")
    p.add_argument("--out", default=None, help="where the steps' results go (default: a new temporary directory)")
    p.set_defaults(func=_selftest)
