"""`recommend`: verify, time and rank every backend on a workload, with deployment checks, on this machine."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from harness.advisor.deploy_checks import check_case, deployment_checks, mask_path
from harness.advisor.evidence import evidence_from_run, measure_now
from harness.advisor.progress import Progress
from harness.advisor.ranking import Overall, Recommendation, overall, rank_backends
from harness.advisor.workload import Workload
from harness.backends.base import Backend
from harness.backends.registry import get_backends
from harness.planning.cost import JobCost
from harness.probes.batch_invariance import batch_invariance_check
from harness.calls.caller import left_as_found
from harness.isolation.executor import CallFailed, Executor, make_executor
from harness.calls.device import resolve_device
from harness.measure.stats import TieConfig
from harness.measure.timing import ADVISOR_TIMING, TimingConfig
from harness.store.host import device_name

#: what `recommend --require` can demand of a backend
REQUIREMENTS = ("batch-invariant",)


def recommend_workload(workload: Workload, *, backends: str | list[str] | None = None, device: str | None = None,
                       results: str | Path | None = None, seed: int = 0, timing: TimingConfig = ADVISOR_TIMING,
                       checks: bool = True, compile_backend: str = "inductor",
                       cfg: TieConfig = TieConfig(), executor: Executor | None = None,
                       require: tuple[str, ...] = (), progress: Progress | None = None,
                       record=None) -> Recommendation:
    """The ranked backends of one workload (rank_backends), with the workload, device and notes. Backend calls run
    through `executor` (default: this process). `require` (REQUIREMENTS): what a backend must show, or be excluded.
    `record(rows, samples_ms)`: told each row measured now (evidence.measure_now)."""
    unknown = sorted(set(require) - set(REQUIREMENTS))
    if unknown:
        raise ValueError(f"require={unknown}; allowed: {', '.join(REQUIREMENTS)}")
    own = executor is None  # made here: closed here (a declared plugin's workers with it)
    executor = executor if executor is not None else make_executor()
    try:
        with left_as_found():  # the caller's process: torch's settings and the stage clock put back
            return _recommend_workload(workload, backends=backends, device=device, results=results, seed=seed,
                                       timing=timing, checks=checks, compile_backend=compile_backend, cfg=cfg,
                                       executor=executor, require=require, progress=progress, record=record)
    finally:
        if own:
            executor.close()


def _recommend_workload(workload: Workload, *, backends, device, results, seed, timing, checks, compile_backend, cfg,
                        executor, require, progress, record) -> Recommendation:
    step = progress.step if progress is not None else (lambda what: None)
    dev = resolve_device(device)
    chosen = get_backends(backends)
    case = workload.case()
    evidence, notes = {}, []
    if results is not None:
        evidence, note = evidence_from_run(results, case, workload.phase, chosen, dev)
        notes.append(note)
    missing = [b for b in chosen if b.name not in evidence]
    if missing:
        evidence.update(measure_now(case, missing, dev, training=workload.training, seed=seed, timing=timing,
                                    executor=executor, progress=step, record=record))
    for _ in range(len(chosen) - len(missing) + (0 if missing else 1)):  # what the stored run gave: no work left
        step(f"{case.id}: from {results}")
    for backend in chosen:
        e = evidence[backend.name]
        # checks run only for what could be recommended; the mask path (the backend's own translation) for all
        task = (deployment_checks, case, workload.training, seed, compile_backend) if checks and e.eligible \
            else (mask_path, case)
        try:
            e.checks = executor.run(backend, task[0], dev, *task[1:])
        except CallFailed as exc:  # the checks killed or hung the backend's worker: that is what they found
            e.checks = {"compiles": "error", "compile_note": exc.failure.reason, "cuda_graph": "error",
                        "deterministic": "error", "determinism_note": exc.failure.reason}
        step(f"{case.id}: {backend.name} " + ("deployment checks" if task[0] is deployment_checks else "mask path"))
        if "batch-invariant" in require and e.eligible:  # sequence 0 alone vs in the workload's batch, bitwise
            try:
                e.checks.update(executor.run(backend, batch_invariance_check, dev, case, seed))
            except CallFailed as exc:
                e.checks.update(batch_invariant="error", batch_invariance_note=exc.failure.reason)
            if e.checks["batch_invariant"] != "yes":
                e.status, e.reason = "excluded", f"--require batch-invariant: {e.checks['batch_invariance_note']}"
    ranked = rank_backends([evidence[b.name] for b in chosen], cfg)
    ranked.table["case_id"], ranked.table["phase"] = case.id, workload.phase
    return replace(ranked, workload=workload.label, case_id=case.id, phase=workload.phase, device=str(dev),
                   device_name=device_name(dev), threads=torch.get_num_threads(), notes=notes,
                   check_case=check_case(case).id if checks else None)


def recommend(batch: int, heads: int, seq: int, head_dim: int, *, kv_heads: int | None = None,
              seq_k: int | None = None, dtype: str = "bf16", mask: str = "causal", training: bool = False,
              results: str | Path | None = None, backends: str | list[str] | None = None, device: str | None = None,
              seed: int = 0, timing: TimingConfig = ADVISOR_TIMING, checks: bool = True,
              compile_backend: str = "inductor") -> Recommendation:
    """Ranked backends for one shape on this machine: q (batch, heads, seq, head_dim), k/v (batch, kv_heads,
    seq_k, head_dim). `.table` has one row per backend; `.winner` and `.explanation` say which and why."""
    workload = Workload(batch, heads, seq, head_dim, kv_heads=kv_heads, seq_k=seq_k, dtype=dtype, mask=mask,
                        training=training)
    return recommend_workload(workload, backends=backends, device=device, results=results, seed=seed, timing=timing,
                              checks=checks, compile_backend=compile_backend)


def steps_per_workload(backends: int) -> int:
    """recommend_workload's progress steps: the reference and baseline, then each backend's verdict and checks."""
    return 1 + 2 * backends


def step_weights(cost: JobCost, workloads: list[Workload], backends: list[Backend]) -> list[float]:
    """The cost model's seconds of each progress step of recommend_many, in its order (the estimate it printed):
    per workload its reference and baseline, each backend's verdict and timing, then each backend's checks."""
    weights = []  # the start-up (rates, workers) is over before the progress clock starts
    for case in (w.case() for w in workloads):
        weights.append(cost.seconds_of(case.id, stages=("reference",)))
        weights += [cost.seconds_of(case.id, b.name, stages=("correctness", "compile", "timing")) for b in backends]
        weights += [cost.seconds_of(case.id, b.name, "checks") for b in backends]
    return [max(w, 0.01) for w in weights]  # a refused backend or a mask-path look still takes a moment


def recommend_many(workloads: list[Workload], *, progress: bool = False, weights: list[float] | None = None,
                   **kwargs) -> tuple[dict[str, Recommendation], Overall]:
    """One recommendation per workload (by label) and the overall one; with `progress`, a line per step on stderr,
    its time left from `weights` (step_weights: the estimate's seconds per step) when given."""
    steps = len(workloads) * steps_per_workload(len(get_backends(kwargs.get("backends"))))
    shown = Progress(steps, weights=weights, estimated=weights is not None) if progress else None
    recommendations = {w.label: recommend_workload(w, progress=shown, **kwargs) for w in workloads}
    return recommendations, overall(recommendations)
