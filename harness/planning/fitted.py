"""Plans priced at the fitted unit costs and FLOP rates, nothing measured, so a plan is the same on every machine:
fuzzing's case budget, selftest's steps, the GPU main job on an H200 (cost.py's model, rates.py's fitted figures)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from harness.backends.base import Backend
from harness.cases.case import AttentionCase
from harness.planning.cost import Job, MatrixCost, job_cost, matrix_cost
from harness.planning.rates import FITTED, FITTED_FLOP_RATES, H200, H200_MEMORY, RunRates
from harness.store.schema import PHASES

#: the backends of the H200 run the GPU estimate assumes, and --rounds' default
H200_BACKENDS = ("naive", "sdpa", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flex")
H200_ROUNDS = 3


def run_estimate(cases: list[AttentionCase], backends: tuple[str, ...] = H200_BACKENDS,
                 rounds: int = H200_ROUNDS, rates: RunRates | None = None) -> float:
    """Seconds a whole `pytest suites --benchmark` run of `cases` takes on an H200, at its measured FLOP rates and
    `rates` (default: the GPU's unit costs)."""
    from harness.backends.registry import get_backends
    job = Job(tuple(get_backends(list(backends))), PHASES, rounds, probes=True)
    matrix = fitted_matrix(cases, torch.device("cuda"), as_h200=True)
    return job_cost(matrix, job, H200 if rates is None else rates).seconds


#: the reference's and baseline's buffers priced on an H200: what a 141 GB device gives them, at most
H200_BUFFER_BYTES = 8 * 2 ** 30


def fitted_matrix(cases: list[AttentionCase], device: torch.device, *, as_h200: bool) -> MatrixCost:
    """`cases` at the device type's FITTED FLOP rates (a dtype with none at float32's): no rate measured, so a plan
    is the same on every machine; `as_h200`: at an H200's memory and buffer budgets too (none need be here), else
    at `device`'s own."""
    reference, baselines = FITTED_FLOP_RATES.get(device.type, FITTED_FLOP_RATES["cuda"])
    rates = {t: baselines.get(t) or baselines[torch.float32] for t in {c.dtype for c in cases}}
    if not as_h200:
        return matrix_cost(cases, device, rate=reference, baseline_rates=rates)
    return matrix_cost(cases, device, rate=reference, baseline_rates=rates, memory=H200_MEMORY,
                       reference_budget_bytes=H200_BUFFER_BYTES, baseline_budget_bytes=H200_BUFFER_BYTES)


class FittedCost(NamedTuple):
    """A case's seconds at the FITTED unit costs: its float64 reference and baseline alone, and the whole case; and
    whether its reference and baseline fit the device's memory."""

    reference_s: float
    seconds: float
    fits: bool


def fitted_case_cost(case: AttentionCase, backends: tuple[Backend, ...], device: torch.device) -> FittedCost:
    """`case` with each backend's correctness calls and compiles, priced at the device type's FITTED unit costs and
    FLOP rates (fitted_matrix): a plan a seed makes the same on every machine (fuzz)."""
    matrix = fitted_matrix([case], device, as_h200=False)
    job = job_cost(matrix, Job(backends, session=False), FITTED.get(device.type, H200))
    return FittedCost(matrix.case_seconds(matrix.costs[0]), sum(s.seconds for s in job.steps if s.stage != "start"),
                      matrix.largest.peak_bytes <= matrix.memory)


def backend_seconds(cases: list[AttentionCase], backends: tuple[Backend, ...], device_type: str,
                    timed: bool) -> dict[str, float]:
    """Seconds a suites run of `cases` (one timing round when `timed`) spends on each backend - its correctness calls
    and compiles, and its timing - at the device type's FITTED unit costs and FLOP rates, nothing measured: what
    selftest's plan prices a step at (the cases' references and baselines are the step's own fixed cost)."""
    matrix = fitted_matrix(cases, torch.device(device_type), as_h200=device_type == "cuda")
    job = job_cost(matrix, Job(backends, PHASES if timed else (), 1, session=False), FITTED.get(device_type, H200))
    spent = {b.name: 0.0 for b in backends}
    for step in job.steps:
        if step.stage in ("correctness", "compile", "timing") and len(step.key) > 1:
            spent[step.key[1]] += step.seconds
    return spent
