"""One benchmark round of a verified (case, backend, phase): latency, peak memory, FLOP/s, roofline, its row."""

from __future__ import annotations

from dataclasses import dataclass

from harness.backends.base import Backend
from harness.calls.cache import LRU
from harness.calls.call import Call
from harness.isolation.executor import Executor, make_executor
from harness.calls.outcome import BackendResult
from harness.run.audit import audited_time
from harness.run.judge import judge_timed
from harness.run.rounds import Round
from harness.calls.timed import TimingCall
from harness.measure.limits.bandwidth import roofline_columns
from harness.measure.limits.flops import attention_flops
from harness.measure.measurement import Measurement
from harness.measure.limits.peaks import beyond_physical_limit
from harness.measure.stages import stage
from harness.measure.timing import TimingConfig
from harness.oracle.prepared import PreparedCase
from harness.cases.case import dtype_name
from harness.store.rows import make_row
from harness.store.schema import FWD_BWD, NOT_TIMED, PASS, REJECTED, TIMED, VERDICT_PHASES, Row


@dataclass
class PerfResult:
    """A round's row (latency pooled over the rounds so far), its measurement and the pooled one (None: not timed)."""

    row: Row
    measurement: Measurement | None
    pooled: Measurement | None = None


def phase_verdict(verdict: BackendResult, phase: str) -> tuple[str, str]:
    """(correctness status, reason) that gates timing (fwd+bwd: both phases); the reason names the phase."""
    for p in (VERDICT_PHASES if phase == FWD_BWD else [phase]):
        row = verdict.row(p)
        if row.status != PASS:
            return row.status, f"{p} is {row.status}: {row.reason}"
    return PASS, ""


def measure_phase(backend: Backend, prepared: PreparedCase, phase: str, verdict: BackendResult, *,
                  config: TimingConfig, peaks: dict[str, float], run_id: str = "",
                  cpu_mem_budget: int | None = None, timing_round: Round = Round(), executor: Executor | None = None,
                  bw_peak: float | None = None, pools: LRU | None = None) -> PerfResult:
    """Time one round of a verified phase and build its row, final as built: every outcome goes through `row`.
    bw_peak: the copy bandwidth (GB/s) a memory-bound row is judged against; pools: the run's timed-content pools
    (RunCaches.pools), kept between rounds. Only a fwd+bwd row carries a correctness status (fwd and bwd rows fold
    into their verdict rows)."""
    executor = executor if executor is not None else make_executor()
    case, device = prepared.case, prepared.device
    status, reason = phase_verdict(verdict, phase)
    correctness: dict = {"status": None, "reason": None}
    if phase == FWD_BWD:  # a key of its own: carry the correctness of both phases it is made of
        correctness = {"status": status, "reason": reason,
                       "err_ratio": max((r.err_ratio or 0.0) for r in verdict.rows)}

    def row(timing_status: str, timing_reason: str = "", **more) -> Row:
        if timing_status not in (TIMED, REJECTED):  # a rejected round's earlier figures are withheld too
            timing_reason = timing_round.ended(timing_reason)
        elif timing_status == TIMED and not more["suspicious"] and timing_round.suspicious_reason:
            more["suspicious"], timing_reason = True, timing_round.suspicious_reason  # once flagged, stays flagged
        return make_row(run_id=run_id, case=case, backend=backend.name, backend_version=backend.version(),
                        phase=phase, device=device, timing_status=timing_status, timing_reason=timing_reason,
                        **correctness, **more)

    if status != PASS:
        return PerfResult(row(NOT_TIMED, f"not timed: {reason}"), None)
    prior = timing_round.pooled
    timing = TimingCall(Call(case, prepared.seed, prepared.inputs), phase, config,
                        estimate_ms=prior.median if prior is not None else None, known_memory=timing_round.memory,
                        cpu_mem_budget=cpu_mem_budget)
    answer, clock = audited_time(executor, backend, timing, device)
    if answer.failure is not None:
        return PerfResult(row(answer.failure.status, answer.failure.reason, peak_mem_bytes=answer.peak_mem_bytes,
                              mem_method=answer.mem_method), None)
    m, mem_bytes, mem_method = answer.measurement, answer.peak_mem_bytes, answer.mem_method
    with stage("judging timed answers"):  # judge.py decides its threads: the float64 reference of a large slice takes them all
        # a round the machine's load left unauditable is still judged: a wrong answer is never the load's
        problem = ((not clock.loaded and clock.problem)
                   or judge_timed(backend.name, prepared, phase, answer.observed, answer.seed, answer.witness, pools)
                   or answer.integrity)
    if not problem and clock.loaded:  # no figure, and no verdict on the kernel
        return PerfResult(row(NOT_TIMED, f"not timed: {clock.problem}"), None)
    if problem:  # never a number: the figure is in the reason alone, and the key's later rounds are not run
        where = f"round {timing_round.index + 1} of {timing_round.count}: " if timing_round.count > 1 else ""
        return PerfResult(row(REJECTED, f"{where}timed at median {m.median:.4g} ms, but {problem}"), None)
    pooled = m if prior is None else Measurement.merge([prior, m])
    latency = pooled.median
    flops = attention_flops(case, phase)
    dtype = dtype_name(case.dtype)
    roof = roofline_columns(case, phase, flops, latency, peaks.get(dtype), bw_peak)  # the ceiling that binds it
    why = roof.pop("why")
    # a figure beyond the physical limit is never a number: rejected, its figures kept for the reason's audit
    beyond = beyond_physical_limit(dtype, roof["tflops"], roof["gbps"], roof["bytes_moved"], peaks, bw_peak,
                                   device.type)
    shares = [x for x in (timing_round.contention, answer.others_share) if x is not None]
    result = row(REJECTED if beyond else TIMED, beyond or why,
                 **{**pooled.latency_columns(), "timing_mode": m.mode, "threads": m.threads},
                 contention=round(max(shares), 3) if shares else None,
                 peak_mem_bytes=mem_bytes, mem_method=mem_method, flops=flops,
                 compile_ms=answer.compile_ms, **roof)
    return PerfResult(result, m, pooled)
