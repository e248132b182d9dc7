"""What is known of each backend on a workload: measured now (verdict first, then timing) or taken from a run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch

from harness.backends.base import Backend
from harness.compare.runs import run_testbed
from harness.run.benchmark import measure_phase
from harness.isolation.executor import Executor
from harness.run.runner import execute, prepare_case
from harness.measure.limits.bandwidth import copy_bandwidth_samples
from harness.measure.limits.roofline import PEAK_SAMPLES
from harness.measure.timing import TimingConfig
from harness.cases.case import AttentionCase
from harness.store.host import testbed_id
from harness.store.load import load_results, load_samples
from harness.store.schema import (FWD, FWD_BWD, PASS, UNAVAILABLE, VERDICT_PHASES, Row, figures_comparable,
                                  figures_usable)

@dataclass
class Evidence:
    """What is known of one backend on one workload: its verdict, and its samples when it passed and was timed."""
    backend: str
    status: str
    reason: str = ""
    err_ratio: float = math.nan
    samples_ms: tuple[float, ...] = ()
    peak_mem_bytes: float = math.nan
    package: str | None = None
    checks: dict = field(default_factory=dict)
    source: str = "measured now"
    #: GB/s of the least traffic and its share of the measured copy bandwidth (measure.bandwidth)
    gbps: float = math.nan
    pct_of_bw_peak: float = math.nan

    @property
    def eligible(self) -> bool:
        """Only a backend verified correct on the workload and timed on it can be recommended."""
        return self.status == PASS and len(self.samples_ms) > 0

    @property
    def median(self) -> float:
        return float(np.median(self.samples_ms)) if self.samples_ms else math.nan


def _phase_status(rows: list[Row], training: bool) -> tuple[str, str, float]:
    """(status, reason, err_ratio) over the phases the workload uses: fwd, plus bwd when training."""
    by_phase = {r.phase: r for r in rows}
    used = [by_phase[p] for p in (VERDICT_PHASES if training else (FWD,))]
    errs = [math.nan if r.err_ratio is None else float(r.err_ratio) for r in used]
    err = max((e for e in errs if math.isfinite(e)), default=math.nan)
    same = len({(r.status, r.reason or "") for r in used}) == 1
    failed = next((r for r in used if r.status != PASS), None)
    if failed is None:
        return PASS, "", err
    return failed.status, (failed.reason or "") if same else f"{failed.phase}: {failed.reason or ''}", err


def measure_now(case: AttentionCase, backends: list[Backend], device: torch.device, *, training: bool,
                seed: int, timing: TimingConfig, executor: Executor,
                progress: Callable[[str], object], record: Callable[[list[Row], tuple], object] | None = None
                ) -> dict[str, Evidence]:
    """Correctness first (against the float64 reference), then timing and memory of the verified only; `progress` is
    told each step as it ends; `record(rows, samples_ms)` is given each verdict's and timing's rows as made (the
    run folder `recommend` leaves)."""
    record = record or (lambda rows, samples: None)
    prepared = prepare_case(case, device, seed)
    progress(f"{case.id}: float64 reference and naive baseline")
    phase = FWD_BWD if training else FWD
    # the ceiling the % of bandwidth column is against: the best of the samples
    bw_peak = max(copy_bandwidth_samples(device, samples=PEAK_SAMPLES))
    out = {}
    for backend in backends:
        verdict = execute(backend, prepared, executor=executor)
        record(list(verdict.rows), ())
        status, reason, err = _phase_status(verdict.rows, training)
        if status == UNAVAILABLE:  # say too what the backend could not do on this workload where it is available
            more = backend.can_run(case, device)
            reason += f"; and on this workload: {'; '.join(more)}" if more else ""
        e = Evidence(backend.name, status, reason, err, package=backend.package)
        if status == PASS:
            perf = measure_phase(backend, prepared, phase, verdict, config=timing, peaks={}, executor=executor,
                                 bw_peak=bw_peak)
            record([perf.row], () if perf.measurement is None else perf.measurement.samples_ms)
            if perf.measurement is None:  # oom, an error, or rejected (an integrity check failed) while timing
                e.status, e.reason = perf.row.timing_status, perf.row.timing_reason or ""
            else:
                e.samples_ms, e.peak_mem_bytes = perf.measurement.samples_ms, float(perf.row.peak_mem_bytes)
                e.gbps, e.pct_of_bw_peak = perf.row.gbps, perf.row.pct_of_bw_peak
        out[backend.name] = e
        timed = f", timed: median {e.median:.4g} ms" if e.samples_ms else ""
        progress(f"{case.id}: {backend.name} {e.status}{timed}")
    return out


def evidence_from_run(run_dir: str | Path, case: AttentionCase, phase: str, backends: list[Backend],
                      device: torch.device) -> tuple[dict[str, Evidence], str]:
    """Evidence a run directory holds for (case id, phase) from this machine's testbed, and a note on what was used;
    a backend verified there but not timed is left out (measured now)."""
    run_dir = Path(run_dir)
    results = load_results(run_dir)
    rows = results[(results.case_id == case.id) & (results.phase == phase)]
    if rows.empty:
        return {}, f"{run_dir}: {case.id} [{phase}] was not measured there; measured now"
    theirs, ours = run_testbed(run_dir, results), testbed_id(device)
    if theirs != ours:
        return {}, f"{run_dir}: testbed {theirs} is not this machine's ({ours}); measured now"
    samples = load_samples(run_dir)
    samples = samples[(samples.case_id == case.id) & (samples.phase == phase)]
    by_backend = {name: tuple(g.latency_ms.astype(float)) for name, g in samples.groupby("backend")}
    out = {}
    for backend in backends:
        match = rows[rows.backend == backend.name]
        r = None if match.empty else match.iloc[0]
        if r is not None and not figures_comparable(r.get("timing_status"), r.get("suspicious")):
            # rejected, or beyond the measured peak: an exclusion with its reason
            status = str(r.timing_status) if not figures_usable(r.get("timing_status")) else "suspicious"
            out[backend.name] = Evidence(backend.name, status, str(r.get("timing_reason") or ""),
                                         package=backend.package, source=f"run {run_dir.name}")
        elif r is not None and (r.status != PASS or by_backend.get(backend.name)):
            out[backend.name] = Evidence(backend.name, str(r.status), "" if pd.isna(r.reason) else str(r.reason),
                                         float(r.err_ratio) if pd.notna(r.err_ratio) else math.nan,
                                         by_backend.get(backend.name, ()),
                                         float(r.peak_mem_bytes) if pd.notna(r.peak_mem_bytes) else math.nan,
                                         package=backend.package, source=f"run {run_dir.name}")
    return out, f"{run_dir}: used for {', '.join(out) or 'no backend'}"
