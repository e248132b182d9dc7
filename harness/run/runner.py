"""Runs one backend on one case: forward and backward judged against the prepared reference, a row per phase."""

from __future__ import annotations

from dataclasses import replace

import torch

from harness.backends.base import Backend
from harness.calls.bound import Arrangement
from harness.calls.call import Call, CallResult
from harness.isolation.executor import Executor, make_executor
from harness.calls.outcome import BackendResult, Failure, free
from harness.measure.stages import stage
from harness.oracle.baseline import baseline
from harness.oracle.placement import judging_device, reference_bytes
from harness.oracle.prepared import PreparedCase
from harness.oracle.reference import attended, reference_attention
from harness.oracle.verdict import Check
from harness.cases.case import AttentionCase, Inputs, make_inputs
from harness.cases import fp8
from harness.cases.paged import FORWARD_ONLY
from harness.store.rows import make_row
from harness.store.host import available_memory
from harness.store.schema import BASELINE, BWD, FAIL, FWD, JUDGED, PASS, UNSUPPORTED, VERDICT_PHASES, Row


def verdict_row(prepared: PreparedCase, backend: Backend, phase: str, status: str, reason: str = "",
                checks: list[Check] | None = None, run_id: str = "", op: str = "", tag: str = "") -> Row:
    """A correctness row of `backend` on the prepared case; `op`: the kernel that answered; `tag`: a probe's key."""
    return make_row(run_id=run_id, case=prepared.case, backend=backend.name, backend_version=backend.version(),
                    phase=phase, device=prepared.device, status=status, reason=reason, checks=checks or (), tag=tag,
                    backend_op=op if status in JUDGED else "",
                    modifier_path=backend.modifier_path(prepared.case)
                    if prepared.case.modifiers and status in JUDGED else None,
                    baseline=prepared.baseline if checks and backend.name != BASELINE else None,
                    quant_err=prepared.quant_err if status in JUDGED and phase == FWD else None)


def baseline_budget(device: torch.device) -> int:
    """Bytes the naive baseline's scores may take unchunked: a quarter of free memory (CPU: at most 4 GiB)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] // 4
    return min(4 * 2 ** 30, available_memory() // 4)


def prepare_case(case: AttentionCase, device: torch.device, seed: int = 0, *, inputs: Inputs | None = None,
                 reference_inputs: Inputs | None = None, budget_bytes: int | None = None) -> PreparedCase:
    """Inputs (seeded unless given), the float64 reference and the naive baseline's errors for `case`;
    `reference_inputs` (default: the inputs) feed reference and baseline (dense within `budget_bytes`)."""
    seeded = inputs is None
    with stage("inputs"):
        inputs = make_inputs(case, device, seed) if seeded else inputs
    clean = inputs if reference_inputs is None else reference_inputs
    unquantized = clean if case.fp8_kv is not None else None
    clean = attended(case, clean)
    # FP64 where the inputs are (a GPU: seconds where the CPU takes hours), kept where the verdicts are computed:
    # on a GPU run the device when it fits (oracle/placement.py), so no answer is judged on the host
    with stage("reference"):
        reference = reference_attention(case, clean)
        reference = reference.to(judging_device(device, reference_bytes(reference.tensors())))
    prepared = PreparedCase(case, device, inputs, reference, None, seed=seed if seeded else None)
    if unquantized is not None:  # the second figure: what the quantization itself costs the output
        with stage("reference"):
            plain = reference_attention(case, unquantized, grads=False).out.to(reference.out.device)
        prepared.quant_err = float((reference.out - plain).abs().max())
        clean = clean.map(lambda t: t.to(case.dtype))                      # the baseline computes in the case's dtype
    try:
        with stage("naive baseline"):
            naive = baseline(case, clean, prepared.reference, baseline_budget(device) if budget_bytes is None
                             else budget_bytes)
        prepared.baseline = naive.method
        if naive.usable:
            prepared.naive_errors = {q: c.err for q, c in naive.checks.items()}
            return prepared
        why = "fail: " + "; ".join(c.describe() for c in naive.checks.values() if not c.passed)
    except Exception as exc:  # e.g. out of memory even in chunks
        failure = Failure.of(exc)
        why = f"{failure.status}: {failure.reason}"
        free(device)
    # Without a trustworthy same-precision baseline, the naive bound stands in for it.
    prepared.baseline = "NAIVE_BOUND (naive baseline unusable)"
    prepared.naive_note = f"naive baseline unusable ({why}); tolerance uses NAIVE_BOUND"
    return prepared


def refusal(backend: Backend, case: AttentionCase, device: torch.device,
            executor: Executor | None = None) -> tuple[str, str] | None:
    """(status, reason) when `backend` cannot run `case`'s forward on `device` at all, else None."""
    executor = executor if executor is not None else make_executor()
    if refused := executor.refusal(backend, device):
        return refused
    reasons = backend.can_run(case, device)
    return (UNSUPPORTED, "; ".join(reasons)) if reasons else None


def backward_reason(backend: Backend, case: AttentionCase, device: torch.device) -> str:
    """Why the correctness call of `backend` on `case` runs no backward ("" when it does)."""
    return (fp8.FORWARD_ONLY if case.fp8_kv is not None else FORWARD_ONLY if case.page_size is not None
            else "; ".join(backend.backward_reasons(device)))


def correctness_call(backend: Backend, case: AttentionCase, device: torch.device, seed: int | None = 0,
                     inputs: Inputs | None = None, arrangement: Arrangement | None = None) -> Call:
    """The call that checks `backend` on `case`: no-grad, then forward and backward where it has a backward here."""
    backward = not backward_reason(backend, case, device)
    return Call(case, seed, inputs, backward=backward, arrangement=arrangement, inference=backward)


def execute(backend: Backend, prepared: PreparedCase, run_id: str = "", *, arrangement: Arrangement | None = None,
            executor: Executor | None = None, tag: str = "") -> BackendResult:
    """Run `backend` on the prepared case and judge both phases; a probe's `tag` keys its rows 'tag:<case id>'."""
    executor = executor if executor is not None else make_executor()
    case, device = prepared.case, prepared.device

    def both(status: str, reason: str, op: str = "") -> BackendResult:
        return BackendResult([verdict_row(prepared, backend, p, status, reason, run_id=run_id, op=op, tag=tag)
                              for p in VERDICT_PHASES])

    if refused := refusal(backend, case, device, executor):
        return both(*refused)
    bwd_reason = backward_reason(backend, case, device)
    call = correctness_call(backend, case, device, prepared.seed, prepared.inputs, arrangement)
    answer = executor.call(backend, call, device)
    if answer.failure is not None and answer.failure.backward_only:  # the forward runs; only its backward cannot
        bwd_reason = answer.failure.reason
        call = replace(call, backward=False)
        answer = executor.call(backend, call, device)
    if answer.failure is not None:  # raised, died, timed out, or broke the output contract
        free(device)
        return both(answer.failure.status, answer.failure.reason, answer.op)
    result = _judged_forward(backend, prepared, call, answer, run_id, tag)
    if bwd_reason:
        result.rows.append(verdict_row(prepared, backend, BWD, UNSUPPORTED, bwd_reason, run_id=run_id, tag=tag))
    elif answer.backward_failure is not None:
        free(device)
        result.rows.append(verdict_row(prepared, backend, BWD, answer.backward_failure.status,
                                       answer.backward_failure.reason, run_id=run_id, op=answer.backward_op,
                                       tag=tag))
    else:
        result.rows.append(_judged_backward(backend, prepared, answer, result, run_id, tag))
    return result


def _judged_forward(backend: Backend, prepared: PreparedCase, call: Call, answer: CallResult, run_id: str,
                    tag: str) -> BackendResult:
    # the fwd verdict judges the no-grad call and the training call's output: the worse stands, a failure names it
    outs = {"no-grad": answer.inference_out, "grad" if call.backward else "no-grad": answer.out}
    with stage("judging"):
        verified = {kind: prepared.judged("out", t, backend.name) for kind, t in outs.items() if t is not None}
    check = max(verified.values(), key=lambda c: c.ratio)
    failed = [(f"[fwd, {kind}] " if len(verified) > 1 else "") + c.describe()
              for kind, c in verified.items() if not c.passed]
    result = BackendResult([], {"out": check}, answer.out)
    reason = "; ".join(filter(None, [*failed, prepared.note_for(backend.name)]))
    result.rows.append(verdict_row(prepared, backend, FWD, PASS if check.passed else FAIL, reason, [check],
                                   run_id, op=answer.op, tag=tag))
    return result


def _judged_backward(backend: Backend, prepared: PreparedCase, answer: CallResult, result: BackendResult,
                     run_id: str, tag: str) -> Row:
    case = prepared.case
    for name in case.grads:
        result.grads[name] = answer.grads[name]
        with stage("judging"):
            result.checks[name] = prepared.judged(name, answer.grads[name], backend.name)
    checks = [result.checks[name] for name in case.grads]
    failed = [c.describe() for c in checks if not c.passed]
    return verdict_row(prepared, backend, BWD, FAIL if failed else PASS,
                       "; ".join(filter(None, failed + [prepared.note_for(backend.name)])), checks, run_id,
                       op=answer.backward_op, tag=tag)
