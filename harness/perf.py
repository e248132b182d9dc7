"""Performance of one (case, backend, phase): latency, peak memory, FLOP/s and roofline, only for verified backends."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Protocol

import numpy as np

import torch

from harness.backends.base import Backend
from harness.case import AttentionCase, Inputs, dtype_name
from harness.env import device_name, git_state, testbed_id
from harness.flops import attention_flops
from harness.memory import peak_memory
from harness.runner import BackendResult, _failure_status, _free, backend_inputs, case_columns
from harness.timing import NOISE_THRESHOLD, Measurement, TimingConfig, measure

PHASES = ("fwd", "bwd", "fwd+bwd")


@dataclass
class PerfResult:
    row: dict
    #: this call's measurement (one round); the row's latency columns pool it with the earlier rounds
    measurement: Measurement | None


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


def pooled_latency(rounds: Sequence[Sequence[float]]) -> dict:
    """Latency columns from the samples of every round so far: pooled median/IQR/min, and round_spread, the
    range of the round medians over the pooled median (how far the run's conditions moved this key)."""
    pooled = Measurement(tuple(float(x) for r in rounds for x in r), mode="pooled", threads=0)
    medians = [float(np.median(r)) for r in rounds]
    spread = (max(medians) - min(medians)) / pooled.median if pooled.median > 0 else float("nan")
    return {"latency_ms": pooled.median, "latency_iqr_ms": pooled.iqr, "latency_min_ms": pooled.min,
            "n_samples": pooled.n, "rounds": len(rounds), "round_spread": spread,
            "noisy": pooled.noisy or spread > NOISE_THRESHOLD}


def phase_verdict(verdict: BackendResult, phase: str) -> tuple[str, str]:
    """(status, reason) that gates timing: a phase is timed only when its correctness passed."""
    by_phase = {r["phase"]: r for r in verdict.rows}
    needed = ["fwd", "bwd"] if phase == "fwd+bwd" else [phase]
    for p in needed:
        if by_phase[p]["status"] != "pass":
            return by_phase[p]["status"], f"not timed: {p} is {by_phase[p]['status']}: {by_phase[p]['reason']}"
    return "pass", ""


def phase_callables(backend: Backend, prepared: TimedCase, phase: str):
    """(setup, fn) for a phase. fwd: inference (no autograd); bwd: backward alone on a retained graph with the
    shared dO; fwd+bwd: one training step. Gradients are reset in setup, outside the timed region."""
    case = prepared.case
    q, k, v, d_out = backend_inputs(backend, prepared.inputs, requires_grad=phase != "fwd")

    def forward():
        return backend.forward(q, k, v, mask=case.mask, scale=case.scale)

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
                  cpu_mem_budget: int | None = None, prior_rounds: Sequence[Sequence[float]] = (),
                  known_memory: tuple[int, str] | None = None) -> PerfResult:
    """Time one phase (one round) of a verified backend and build its results row.

    prior_rounds: samples of this key's earlier rounds in the run, pooled into the row's latency columns.
    known_memory: (bytes, method) measured in an earlier round; peak memory is then not measured again.
    """
    case, device = prepared.case, prepared.device
    status, reason = phase_verdict(verdict, phase)
    row = {"run_id": run_id, "backend": backend.name, "phase": phase, **case_columns(case, device),
           "device_name": device_name(device), "testbed_id": testbed_id(device), "torch_version": torch.__version__,
           "backend_version": backend.version(), "git_sha": git_state()[0],
           "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if phase == "fwd+bwd":  # a new key: carry the correctness of both phases it is made of
        row.update(status=status, reason=reason, err_ratio=max(
            (r.get("err_ratio", 0.0) or 0.0) for r in verdict.rows))
    if status != "pass":
        row.update(status=status, reason=reason)
        return PerfResult(row, None)
    row["status"] = "pass"
    try:
        setup, fn = phase_callables(backend, prepared, phase)
        mem_bytes, mem_method = known_memory or peak_memory(fn, device=device, setup=setup)
        if cpu_mem_budget is not None and device.type == "cpu" and mem_bytes > cpu_mem_budget:
            row.update(status="oom", reason=f"needed {mem_bytes} bytes above inputs > CPU budget {cpu_mem_budget}",
                       peak_mem_bytes=mem_bytes, mem_method=mem_method)
            return PerfResult(row, None)
        estimate = float(np.median(np.concatenate(prior_rounds))) if prior_rounds else None
        m = measure(fn, device=device, setup=setup, config=config, estimate_ms=estimate)
    except Exception as exc:
        status, why = _failure_status(exc)
        _free(device)
        row.update(status=status, reason=f"during timing: {why}")
        return PerfResult(row, None)
    latency = pooled_latency([*prior_rounds, m.samples_ms])
    flops = attention_flops(case, phase)
    tflops = flops / (latency["latency_ms"] * 1e-3) / 1e12 if latency["latency_ms"] > 0 else float("nan")
    peak = peaks.get(dtype_name(case.dtype))
    pct = 100.0 * tflops / peak if peak else float("nan")
    row.update(**latency, timing_mode=m.mode, threads=m.threads, peak_mem_bytes=mem_bytes,
               mem_method=mem_method, flops=flops, tflops=tflops, pct_of_peak=pct, suspicious=bool(pct > 100))
    compile_ms = backend.compile_time_ms()
    if compile_ms is not None:
        row["compile_ms"] = compile_ms
    if pct > 100:
        row["reason"] = (f"suspicious: {tflops:.3g} TFLOP/s exceeds the measured {dtype_name(case.dtype)} "
                         f"matmul peak {peak:.3g}")
    return PerfResult(row, m)
