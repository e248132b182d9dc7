"""The GPU acceptance run's steps, most informative first, and the plan that fits them into a time budget."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness.backends.registry import all_backends, get_backends
from harness.cases.matrices import build_matrix
from harness.planning.fitted import backend_seconds
from harness.store.schema import BASELINE

#: seconds a step is expected to take: (fixed, per backend it runs) on a GPU, then on the CPU stand-in. GPU ones as
#: measured on an H200 on 2026-12-04 (9 backends: backends 11 s; tests/gpu ~210 s, a first paged FlashInfer case's JIT
#: 66 s of it; gpu-smoke's ~70 s of compiles; fidelity 29 s), the last three still scaled from 2026-11-30; CPU ones
#: dry-run times on the 2-core VM (docs/design/cli.md). A suites step's per-backend part (None) is the whole-job
#: model's, at the device type's fitted unit costs (planning/fitted.backend_seconds): one cost model for all
ESTIMATES = {"backends": ((15, 0), (15, 0)), "tests-gpu": ((210, 0), (5, 0)), "correctness": ((70, None), (10, None)),
             "benchmark": ((30, None), (10, None)), "fidelity": ((30, 0), (15, 0)), "cuda-graph": ((20, None), (0, 0)),
             "cuda1": ((30, None), (0, 0)), "launch": ((40, 10), (20, 8))}
#: the steps' keys for --steps, in the order they run: most informative first
STEP_KEYS = tuple(ESTIMATES)
#: a step may run to this many times its estimate while the later steps' estimates still fit
TIMEOUT_FACTOR = 2.0
#: the share of the budget the plan fills with estimates: the rest absorbs steps that run over theirs (up to 2x)
PLAN_SHARE = 0.8
#: the backends of the steps that prove a path rather than cover the backends (graphs, launcher, a second GPU), and
#: of the whole CPU stand-in (--dry-run): it proves the steps, CI pays for it, and flex compiles for minutes
SUBSET = (BASELINE, "sdpa")
#: pytest exit codes that are results (0 all passed, 1 some tests failed: a backend failing a case)
PYTEST_RESULTS = (0, 1)


@dataclass
class Step:
    key: str
    name: str
    command: list[str]
    estimate_s: float
    #: exit codes that mean the step ran as designed
    ok_codes: tuple[int, ...] = (0,)
    #: the results directory whose rows the step's summary reads
    results: Path | None = None
    #: why the step does not run (empty: it runs)
    skip: str = ""
    #: the table's detail from the step's stdout (default: its last line)
    summarize: Callable[[str], str] | None = None
    outcome: dict = field(default_factory=dict)
    #: a step that writes rows as it goes may run on less than its estimate, down to this (one backend's share):
    #: stopped at its timeout, the rows it finished are its result (0: all or nothing)
    least_s: float = 0.0


def _backends_summary(stdout: str) -> str:
    """'ok: naive, sdpa, ...; unavailable: xformers, flash-attn' from `harness backends`' lines (reasons: its log)."""
    ok, not_ok = [], []
    for line in stdout.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 2 and fields[0] != "kernels:":
            (ok if line.rstrip().endswith(" ok") else not_ok).append(fields[0])
    return f"ok: {', '.join(ok) or '-'}; unavailable: {', '.join(not_ok) or '-'}"


def steps(dry_run: bool, work: Path, gpus: int, backends: list[str]) -> list[Step]:
    """Every step for `backends` (those that can run here), or their CPU stand-ins for --dry-run."""
    device, matrix = ("cpu", "smoke") if dry_run else ("cuda", "gpu-smoke")
    subset = [b for b in SUBSET if b in backends] or backends[:2]
    # one measurement round: the acceptance run proves the paths; rounds are for compare
    suites = ["-m", "pytest", "--device", device, "--matrix", matrix, "-q", "-p", "no:cacheprovider",
              "--benchmark-quiet", "--no-report", "--rounds", "1"]
    chosen, few = ["--backends", ",".join(backends)], ["--backends", ",".join(subset)]
    no_gpu = "dry run: needs a CUDA device" if dry_run else ""

    cases = build_matrix(matrix)

    def priced(names: list[str], timed: bool) -> list[float]:
        """Each backend's seconds of a suites step (its calls, compiles and, `timed`, its round) by the cost model."""
        known = tuple(get_backends([n for n in names if n in all_backends()]))
        spent = backend_seconds(cases, known, device, timed) if known else {}
        return [spent.get(n, max(spent.values(), default=0.0)) for n in names]

    def step(key: str, name: str, args: list[str], n: int | list[str] = 0, rows: str = "", timed: bool = False,
             **kwargs) -> Step:
        """A step of `n` backends (names: priced each by the cost model); with `rows`, a pytest run whose rows (under
        work/<rows>) summarize it."""
        fixed, each = ESTIMATES[key][1 if dry_run else 0]
        shares = priced(n, timed) if each is None else [each] * (n if isinstance(n, int) else len(n))
        if rows:
            args = [*args, "--results-dir", str(work / rows)]
            kwargs.update(ok_codes=PYTEST_RESULTS, results=work / rows, least_s=fixed + max(shares[:1], default=0))
        return Step(key, name, [sys.executable, *args], fixed + sum(shares), **kwargs)

    return [
        step("backends", "backends", ["-m", "harness", "backends", "--device", device], summarize=_backends_summary),
        # the check of every backend on gpu-smoke is the correctness step: not run twice
        step("tests-gpu", "tests/gpu", ["-m", "pytest", "tests/gpu", "-q", "-p", "no:cacheprovider", "-rs", "-k",
                                        "not every_installed_backend"], ok_codes=(0, 5) if dry_run else (0,)),
        step("correctness", f"correctness {matrix}", [*suites, "suites", *chosen], backends, "correct"),
        # timing needs a passed verdict in its own session: this step judges its cases again before timing them
        step("benchmark", f"benchmark {matrix} (1 round)",
             [*suites, "suites/benchmark/test_performance.py", "--benchmark", *chosen], backends, "bench", timed=True),
        step("fidelity", "fidelity vs " + ("a wall clock" if dry_run else "triton do_bench"),
             [*suites, "suites/benchmark/test_timing_fidelity.py", "--benchmark"], 0, "fidelity"),
        step("cuda-graph", "--cuda-graph", [*suites, "suites/benchmark/test_performance.py", "--benchmark",
                                            "--cuda-graph", *few], subset, "graph", timed=True, skip=no_gpu),
        step("cuda1", "cuda:1", [*[a if a != "cuda" else "cuda:1" for a in suites], "suites/correctness", *few],
             subset, "cuda1", skip=no_gpu or ("" if gpus >= 2 else f"{gpus} CUDA device(s): cuda:1 needs two")),
        # the launcher's own --results-dir comes before the suites' options
        step("launch", "run --gpus all" if not dry_run else "run --cpu-shards 2",
             ["-m", "harness", "run", *(["--cpu-shards", "2"] if dry_run else ["--gpus", "all"]), "--results-dir",
              str(work / "launch"), "--", "--matrix", matrix, *few, "-q", "--no-report"], len(subset),
             ok_codes=PYTEST_RESULTS, results=work / "launch"),
    ]


def fit(planned: list[Step], budget_s: float) -> None:
    """Mark not run every step whose estimate no longer fits in PLAN_SHARE of `budget_s` after the steps before it
    (a step that writes rows as it goes planned on its least share instead, where that fits)."""
    left = PLAN_SHARE * budget_s
    for step in planned:
        if step.skip:
            continue
        if step.estimate_s > left and 0 < step.least_s <= left:
            # the rows of part of the cases are worth more than none: planned on one backend's share, it runs on
            # (timeout_for) while later steps' estimates still fit
            step.estimate_s = step.least_s
            left -= step.estimate_s
        elif step.estimate_s > left:  # a later, cheaper step may still fit
            step.skip = (f"not run: over budget (~{step.estimate_s:.0f} s needed, {left:.0f} s of the plan's "
                         f"{PLAN_SHARE * budget_s:.0f} left; --budget-s {budget_s:.0f})")
        else:
            left -= step.estimate_s


def timeout_for(step: Step, later: list[Step], left_s: float) -> float:
    """Seconds `step` may run when `left_s` remain: TIMEOUT_FACTOR times its estimate, less what later steps need."""
    reserved = sum(s.estimate_s for s in later if not s.skip)
    return min(TIMEOUT_FACTOR * step.estimate_s, left_s - reserved)


def choose(planned: list[Step], keys: list[str] | None) -> None:
    """Keep the steps named by --steps (others: not run, asked)."""
    unknown = [k for k in keys or () if k not in STEP_KEYS]
    if unknown:
        raise ValueError(f"--steps {','.join(unknown)}: allowed {', '.join(STEP_KEYS)}")
    for step in planned:
        if keys is not None and step.key not in keys and not step.skip:
            step.skip = "not run: not in --steps"

