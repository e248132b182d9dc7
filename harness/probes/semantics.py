"""Semantics questions: where backends follow different conventions, record what each one does (status 'observed').

Each question runs a small probe per backend and answers with a short value for the CSV `observed` column
('top-left', 'out=0 dq=0 dk,dv=ok', ...). Questions about a library's own arguments use the native probes a
backend declares in `native_probes` (the Backend contract), written next to its mask translation, in the
backend's layout. A backend without the probe gets an 'unsupported' row saying so; a probe that raises is
itself an answer ('refused', with the library's message as the reason), since refusing is a behaviour users
need to know about.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from harness.backends.base import Backend
from harness.execution.cache import LRU
from harness.execution.executor import Executor, make_executor
from harness.execution.outcome import BackendResult
from harness.execution.runner import execute
from harness.oracle.prepared import PreparedCase
from harness.oracle.reference import reference_attention
from harness.oracle.verdict import Check, judge
from harness.probes.common import classify, probe_dtype, probe_row
from harness.probes.modifier_semantics import MODIFIER_QUESTIONS
from harness.probes.probe import Answer, Probe, skip
from harness.spec.case import AttentionCase, Inputs
from harness.spec.masks import Causal, CausalBottomRight, KeyPadding, MaskSpec
from harness.store.schema import BWD, ERROR, FWD, FWD_BWD, NOT_RUN, OBSERVED, UNSUPPORTED, Row

#: batch element 0 sees no key at all (empty rows); element 1 sees keys 0-3 of 7 (partial rows)
PADDING = KeyPadding((0, 4))
#: not 1/sqrt(16) = 0.25, so a backend that ignores `scale` shows
SCALE = 0.3


def semantics_case(dtype: torch.dtype) -> AttentionCase:
    """The shared probe case: (2, 2, 5x7, 16), PADDING, SCALE."""
    return AttentionCase(2, 2, 5, 16, dtype, seq_k=7, mask=PADDING, scale=SCALE)


def _naive_err(prepared: PreparedCase, backend: Backend, quantity: str) -> float | None:
    return prepared.naive_error(quantity, backend.name)


def _empty_rows(case: AttentionCase) -> torch.Tensor:
    """(B, H, Sq) bool: query rows that see no key."""
    return ~case.key_mask().any(-1).expand(case.batch, case.heads, case.seq_q)


def _mean_v(case: AttentionCase, inputs: Inputs) -> torch.Tensor:
    """(B, H, Sq, D): each row's uniform average of V over every key, what a finite mask value gives an empty row."""
    v = inputs.v.to("cpu", torch.float64).repeat_interleave(case.heads // case.kv_heads, dim=1)
    return v.mean(2, keepdim=True).expand(case.batch, case.heads, case.seq_q, case.head_dim)


def _visible(x: torch.Tensor, case: AttentionCase) -> torch.Tensor:
    """x (B, H, Sq, D) with the empty rows zeroed, so checks judge only rows that see keys."""
    return x.detach().to("cpu", torch.float64).masked_fill(_empty_rows(case)[..., None], 0.0)


def _judge_visible(out: torch.Tensor, ref: torch.Tensor, prepared: PreparedCase, backend: Backend) -> Check:
    case = prepared.case
    return judge("out", _visible(out, case), _visible(ref, case), case.dtype, _naive_err(prepared, backend, "out"))


def _state(check: Check) -> str:
    return "NaN" if check.nonfinite else ("ok" if check.passed else f"wrong(err {check.err:.2g})")


def _spec_run(probe: Probe) -> tuple[PreparedCase, BackendResult, Answer | None]:
    """The semantics case through the backend's own mask translation, forward and backward, and the answer
    to give instead when that run produced no output (see _result_failure)."""
    backend, device, seed = probe.backend, probe.device, probe.seed
    prepared = probe.prepared(semantics_case(probe_dtype(backend, device)))
    result = probe.cached(("spec", backend, str(device), seed),
                          lambda: execute(backend, prepared, executor=probe.executor))
    return prepared, result, _result_failure(result)


def _result_failure(result: BackendResult) -> Answer | None:
    """A run that did not produce an output: unsupported/unavailable stay so; an exception is the answer."""
    if result.out is not None:
        return None
    if result.status in NOT_RUN:
        return Answer(result.status, "", result.reasons)
    return Answer(OBSERVED, ERROR, result.reasons)


def fully_masked_rows(probe: Probe) -> tuple[AttentionCase, Answer]:
    """Rows whose every key is masked: output 0 / NaN / mean(V) / garbage / error, and the gradients."""
    prepared, result, failed = _spec_run(probe)
    case = prepared.case
    if failed:
        return case, failed
    empty = _empty_rows(case)
    parts = [f"out={classify(result.out.cpu()[empty], _mean_v(case, prepared.inputs)[empty])}"]
    if "dq" in result.grads:
        parts.append(f"dq={classify(result.grads['dq'].cpu()[empty])}")
        dk, dv = _state(result.checks["dk"]), _state(result.checks["dv"])
        parts.append(f"dk,dv={dk}" if dk == dv else f"dk={dk} dv={dv}")
    else:
        parts.append(f"grads={result.row(BWD).status}")
    return case, Answer(OBSERVED, " ".join(parts), result.reasons, list(result.checks.values()))


def scale_honoured(probe: Probe) -> tuple[AttentionCase, Answer]:
    """Is a non-default `scale` used (versus silently 1/sqrt(head_dim))? Judged on rows that see keys."""
    prepared, result, failed = _spec_run(probe)
    case = prepared.case
    if failed:
        return case, failed
    check = _judge_visible(result.out, prepared.reference.out, prepared, probe.backend)
    if check.passed:
        return case, Answer(OBSERVED, "honoured", checks=[check])
    default = reference_attention(replace(case, scale=None), prepared.inputs, grads=False).out.cpu()
    if _judge_visible(result.out, default, prepared, probe.backend).passed:
        return case, Answer(OBSERVED, "ignored (used 1/sqrt(head_dim))", checks=[check])
    return case, Answer(OBSERVED, f"wrong (err {check.err:.3g})", checks=[check])


def nan_in_masked_kv(probe: Probe) -> tuple[AttentionCase, Answer]:
    """NaN written into K or V at keys the mask hides: does it reach rows that see other keys?"""
    prepared, result, failed = _spec_run(probe)
    case = prepared.case
    if failed:
        return case, failed
    hidden = ~case.key_mask(probe.device).any(2, keepdim=True).transpose(-1, -2)  # (B, 1, Sk, 1): keys nobody sees
    q, k, v, d_out = prepared.inputs[:4]
    parts = []
    for name, poisoned in (("K", Inputs(q, k.masked_fill(hidden, float("nan")), v, d_out)),
                           ("V", Inputs(q, k, v.masked_fill(hidden, float("nan")), d_out))):
        out, why = probe.call(case, poisoned)
        if out is None:  # an exception is this backend's answer to the poisoned input
            parts.append(f"{name}=error ({why})")
        else:
            parts.append(f"{name}={'leaks' if bool(_visible(out, case).isnan().any()) else 'contained'}")
    return case, Answer(OBSERVED, " ".join(parts))


def _native(probe: Probe, native: str, case: AttentionCase) -> Answer | None:
    refusal = skip(probe, case)
    if refusal:
        return refusal
    if native not in probe.backend.native_probes:
        return Answer(UNSUPPORTED, "", f"{probe.backend.name} has no native_{native} probe: it takes mask specs only")
    return None


def _which(probe: Probe, case: AttentionCase, candidates: dict[str, MaskSpec | None]) -> Answer:
    """Call native_causal on `case` and name the candidate mask whose reference it matches."""
    skip = _native(probe, "causal", case)
    if skip:
        return skip
    prepared = {name: probe.prepared(replace(case, mask=m)) for name, m in candidates.items()}
    inputs = next(iter(prepared.values())).inputs                       # same seed and shapes: same inputs
    out, why = probe.call(case, inputs, entry="native_causal")
    if out is None:
        return Answer(OBSERVED, "refused", why)
    checks = {name: judge("out", out, p.reference.out, case.dtype, _naive_err(p, probe.backend, "out"))
              for name, p in prepared.items()}
    for name, check in checks.items():
        if check.passed:
            return Answer(OBSERVED, name, checks=[check])
    errs = ", ".join(f"{name} {c.err:.3g}" for name, c in checks.items())
    return Answer(OBSERVED, "neither", f"err vs {errs}", list(checks.values()))


def causal_non_square(probe: Probe) -> tuple[AttentionCase, Answer]:
    """The library's causal flag with seq_q=5 < seq_k=9: top-left, bottom-right, or refused."""
    case = AttentionCase(2, 2, 5, 16, probe_dtype(probe.backend, probe.device), seq_k=9)
    return case, _which(probe, case, {"top-left": Causal(), "bottom-right": CausalBottomRight()})


def decode_causal(probe: Probe) -> tuple[AttentionCase, Answer]:
    """Causal flag on a decode step (seq_q=1 over 9 keys): does the query see every key (causal off, FA2)?"""
    case = AttentionCase(2, 2, 1, 16, probe_dtype(probe.backend, probe.device), seq_k=9)
    return case, _which(probe, case, {"sees all keys (causal off)": None, "sees key 0 only (top-left)": Causal()})


def _mask_runs(probe: Probe) -> dict[str, tuple[torch.Tensor | None, str]]:
    """native_mask with the semantics case's mask as bool, additive -inf and additive finfo.min tensors:
    {form: (output or None, why not)} - refusing a mask kind is an answer."""
    case = semantics_case(probe_dtype(probe.backend, probe.device))
    prepared = probe.prepared(case)
    dense = case.key_mask(probe.device)                                 # (B, 1, Sq, Sk)
    zeros = torch.zeros(dense.shape, dtype=case.dtype, device=probe.device)
    forms = {"bool": dense, "additive": zeros.masked_fill(~dense, float("-inf")),
             "finfo.min": zeros.masked_fill(~dense, torch.finfo(case.dtype).min)}
    return {name: probe.call(case, prepared.inputs, entry="native_mask", mask=mask) for name, mask in forms.items()}


def _mask_outputs(probe: Probe) -> dict[str, tuple[torch.Tensor | None, str]]:
    return probe.cached(("mask", probe.backend, str(probe.device), probe.seed), lambda: _mask_runs(probe))


def mask_kinds(probe: Probe) -> tuple[AttentionCase, Answer]:
    """Does the library take a bool mask (True = attend) and an additive one, with the right result?"""
    case = semantics_case(probe_dtype(probe.backend, probe.device))
    skip = _native(probe, "mask", case)
    if skip:
        return case, skip
    prepared = probe.prepared(case)
    outs = _mask_outputs(probe)
    parts, reasons, checks = [], [], []
    for name in ("bool", "additive"):
        out, why = outs[name]
        if out is None:
            parts.append(f"{name}=refused")
            reasons.append(f"{name}: {why}")
            continue
        checks.append(_judge_visible(out, prepared.reference.out, prepared, probe.backend))
        parts.append(f"{name}={_state(checks[-1])}")
    return case, Answer(OBSERVED, " ".join(parts), "; ".join(reasons), checks)


def finite_negative_mask(probe: Probe) -> tuple[AttentionCase, Answer]:
    """Masking with finfo(dtype).min instead of -inf: rows that see keys, and rows masked entirely."""
    case = semantics_case(probe_dtype(probe.backend, probe.device))
    skip = _native(probe, "mask", case)
    if skip:
        return case, skip
    prepared = probe.prepared(case)
    out, why = _mask_outputs(probe)["finfo.min"]
    if out is None:
        return case, Answer(OBSERVED, "refused", why)
    check = _judge_visible(out, prepared.reference.out, prepared, probe.backend)
    empty = _empty_rows(case)
    full = classify(out[empty], _mean_v(case, prepared.inputs)[empty])
    return case, Answer(OBSERVED, f"partial rows={_state(check)} masked rows={full}", checks=[check])


#: question name -> (phase of its row, probe)
QUESTIONS: dict[str, tuple[str, Callable]] = {
    "fully-masked-rows": (FWD_BWD, fully_masked_rows),
    "causal-non-square": (FWD, causal_non_square),
    "decode-causal": (FWD, decode_causal),
    "finite-negative-mask": (FWD, finite_negative_mask),
    "mask-kinds": (FWD, mask_kinds),
    "scale": (FWD, scale_honoured),
    "nan-in-masked-kv": (FWD, nan_in_masked_kv),
}

QUESTIONS.update(MODIFIER_QUESTIONS)  # one list for `ask` and every caller


def ask(question: str, backend: Backend, device: torch.device, *, seed: int = 0, run_id: str = "",
        executor: Executor | None = None, cache: LRU | None = None) -> Row:
    """Answer one question for one backend as a CSV row (case_id 'semantics:<question>:<case id>'); its calls
    run through `executor` (this process, or the backend's worker); runs shared by questions are kept in `cache`
    (the run's probe cache), else made for this question alone."""
    executor = executor if executor is not None else make_executor()
    if question not in QUESTIONS:
        raise ValueError(f"unknown semantics question {question!r}; allowed: {', '.join(QUESTIONS)}")
    phase, question_fn = QUESTIONS[question]
    probe = Probe(backend, device, seed, executor, cache)
    case = semantics_case(probe_dtype(backend, device))
    answer = skip(probe, case)
    if answer is None:
        case, answer = question_fn(probe)
    return probe_row(case, backend, device, tag=f"semantics:{question}", phase=phase, status=answer.status,
                     observed=answer.observed, reason=answer.reason, checks=answer.checks, run_id=run_id)


def describe(row: Row) -> str:
    """One line for logs: 'sdpa-math fully-masked-rows (fp32): out=0 dq=0 dk,dv=ok'."""
    question = row.case_id.split(":")[1]
    return f"{row.backend} {question} ({row.dtype}): {row.observed or row.status} {row.reason}".strip()
