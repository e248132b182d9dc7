"""The benchmark stage for one (case, backend, phase) round: latency, peak memory, FLOP/s and roofline of a
verified backend; only phases whose correctness passed are timed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from harness.backends.base import Backend
from harness.execution.call import BoundCall, backend_inputs
from harness.execution.outcome import BackendResult, failure_status, free
from harness.measure.flops import attention_flops
from harness.measure.memory import peak_memory
from harness.measure.timing import Measurement, TimingConfig, measure
from harness.spec.case import AttentionCase, Inputs, dtype_name
from harness.store.rows import make_row
from harness.store.schema import Row


@dataclass
class PerfResult:
    """The row of one timed round (latency columns pooled over every round so far), this round's measurement and
    the pooled one (None when nothing was timed)."""

    row: Row
    measurement: Measurement | None
    pooled: Measurement | None = None


class TimedCase(Protocol):
    """What timing reads of a case: a PreparedCase, or InputsOnly when the reference is not needed."""

    case: AttentionCase
    device: torch.device
    inputs: Inputs


@dataclass(frozen=True)
class InputsOnly:
    """A case's inputs without its float64 reference: enough to time or capture a verified backend."""

    case: AttentionCase
    device: torch.device
    inputs: Inputs


def phase_verdict(verdict: BackendResult, phase: str) -> tuple[str, str]:
    """(status, reason) that gates timing: a phase is timed only when its correctness passed."""
    needed = ["fwd", "bwd"] if phase == "fwd+bwd" else [phase]
    for p in needed:
        row = verdict.row(p)
        if row.status != "pass":
            return row.status, f"not timed: {p} is {row.status}: {row.reason}"
    return "pass", ""


def phase_callables(backend: Backend, prepared: TimedCase, phase: str):
    """(setup, fn) for a phase. fwd: inference (no autograd); bwd: backward alone on a retained graph with the
    shared dO; fwd+bwd: one training step. Gradients are reset in setup, outside the timed region; the backend's
    `prepare` runs here, once, outside it too."""
    call = BoundCall(backend, prepared.case, prepared.device)
    q, k, v, d_out = backend_inputs(backend, prepared.inputs, requires_grad=phase != "fwd")

    def forward():
        return call(q, k, v)

    def reset():
        q.grad = k.grad = v.grad = None

    if phase == "fwd":
        return None, forward
    if phase == "fwd+bwd":
        return reset, lambda: forward().backward(d_out)
    out = forward()  # built once; retain_graph lets every repetition run the same backward alone
    return reset, lambda: out.backward(d_out, retain_graph=True)


def measure_phase(backend: Backend, prepared: TimedCase, phase: str, verdict: BackendResult, *,
                  config: TimingConfig, peaks: dict[str, float], run_id: str = "",
                  cpu_mem_budget: int | None = None, prior: Measurement | None = None,
                  known_memory: tuple[int, str] | None = None) -> PerfResult:
    """Time one phase (one round) of a verified backend and build its results row.

    prior: this key's earlier rounds in the run, pooled into the row's latency columns.
    known_memory: (bytes, method) measured in an earlier round; peak memory is then not measured again.
    """
    case, device = prepared.case, prepared.device
    status, reason = phase_verdict(verdict, phase)
    columns: dict = {}
    if phase == "fwd+bwd":  # a new key: carry the correctness of both phases it is made of
        columns["err_ratio"] = max((r.err_ratio or 0.0) for r in verdict.rows)

    def row(status: str, reason: str = "", **more) -> Row:
        return make_row(run_id=run_id, case=case, backend=backend.name, backend_version=backend.version(),
                        phase=phase, device=device, status=status, reason=reason, **columns, **more)

    if status != "pass":
        return PerfResult(row(status, reason), None)
    try:
        setup, fn = phase_callables(backend, prepared, phase)
        mem_bytes, mem_method = known_memory or peak_memory(fn, device=device, setup=setup)
        if cpu_mem_budget is not None and device.type == "cpu" and mem_bytes > cpu_mem_budget:
            return PerfResult(row("oom", f"needed {mem_bytes} bytes above inputs > CPU budget {cpu_mem_budget}",
                                  peak_mem_bytes=mem_bytes, mem_method=mem_method), None)
        m = measure(fn, device=device, setup=setup, config=config,
                    estimate_ms=prior.median if prior is not None else None)
    except Exception as exc:
        status, why = failure_status(exc)
        free(device)
        return PerfResult(row(status, f"during timing: {why}"), None)
    pooled = m if prior is None else Measurement.merge([prior, m])
    latency = pooled.median
    flops = attention_flops(case, phase)
    tflops = flops / (latency * 1e-3) / 1e12 if latency > 0 else float("nan")
    peak = peaks.get(dtype_name(case.dtype))
    pct = 100.0 * tflops / peak if peak else float("nan")
    reason = (f"suspicious: {tflops:.3g} TFLOP/s exceeds the measured {dtype_name(case.dtype)} matmul peak {peak:.3g}"
              if pct > 100 else "")
    result = row("pass", reason, **{**pooled.latency_columns(), "timing_mode": m.mode, "threads": m.threads},
                 peak_mem_bytes=mem_bytes, mem_method=mem_method, flops=flops, tflops=tflops, pct_of_peak=pct,
                 suspicious=bool(pct > 100), compile_ms=backend.compile_time_ms())
    return PerfResult(result, m, pooled)
