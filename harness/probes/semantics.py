"""Semantics questions: where backends follow different conventions, record what each one does (status 'observed')."""

from __future__ import annotations

from dataclasses import replace
from functools import wraps
from typing import Callable

import torch

from harness.backends.base import Backend
from harness.calls.cache import LRU, cached
from harness.isolation.executor import Executor, make_executor
from harness.calls.outcome import BackendResult
from harness.run.runner import execute
from harness.oracle.prepared import PreparedCase
from harness.oracle.reference import reference_attention
from harness.oracle.verdict import Check, judge
from harness.probes.common import Answer, Probe, classify, empty_rows, matching, mean_v, probe_dtype, probe_row, skip
from harness.cases.case import AttentionCase, Inputs
from harness.cases.masks import Causal, CausalBottomRight, KeyPadding, MaskSpec
from harness.cases.modifiers import alibi_slopes, softcap_scores
from harness.store.schema import BWD, ERROR, FWD, FWD_BWD, NOT_RUN, OBSERVED, UNSUPPORTED, Row

#: batch element 0 sees no key at all (empty rows); element 1 sees keys 0-3 of 7 (partial rows)
PADDING = KeyPadding((0, 4))
#: not 1/sqrt(16) = 0.25, so a backend that ignores `scale` shows
SCALE = 0.3


def semantics_case(dtype: torch.dtype) -> AttentionCase:
    return AttentionCase(2, 2, 5, 16, dtype, seq_k=7, mask=PADDING, scale=SCALE)


def _visible(x: torch.Tensor, case: AttentionCase) -> torch.Tensor:
    """x (B, H, Sq, D) with the empty rows zeroed, so checks judge only rows that see keys."""
    return x.detach().to("cpu", torch.float64).masked_fill(empty_rows(case)[..., None], 0.0)


def _judge_visible(out: torch.Tensor, ref: torch.Tensor, prepared: PreparedCase, backend: Backend) -> Check:
    case = prepared.case
    return judge("out", _visible(out, case), _visible(ref, case), case.dtype, prepared.naive_error("out", backend.name))


def _state(check: Check) -> str:
    return "NaN" if check.nonfinite else ("ok" if check.passed else f"wrong(err {check.err:.2g})")


def _on_spec_run(answer: Callable[[Probe, PreparedCase, BackendResult], Answer]) -> Callable:
    """A question answered from the semantics case's run (forward and backward, once per probe cache); a run
    without output answers instead: unsupported/unavailable stay so, an exception is the answer."""

    @wraps(answer, assigned=("__module__", "__name__", "__qualname__", "__doc__"))
    def question(probe: Probe) -> tuple[AttentionCase, Answer]:
        backend, device = probe.backend, probe.device
        prepared = probe.prepared(semantics_case(probe_dtype(backend, device)))
        result = cached(probe.cache, ("spec", backend, str(device), probe.seed),
                        lambda: execute(backend, prepared, executor=probe.executor))
        if result.out is not None:
            return prepared.case, answer(probe, prepared, result)
        if result.status in NOT_RUN:
            return prepared.case, Answer(result.status, "", result.reasons)
        return prepared.case, Answer(OBSERVED, ERROR, result.reasons)

    del question.__wrapped__  # its signature is (probe) -> (case, answer), not answer's: inspect must not follow
    return question


@_on_spec_run
def fully_masked_rows(probe: Probe, prepared: PreparedCase, result: BackendResult) -> Answer:
    """Rows whose every key is masked: output 0 / NaN / mean(V) / garbage / error, and the gradients."""
    empty = empty_rows(prepared.case)
    parts = [f"out={classify(result.out.cpu()[empty], mean_v(prepared.case, prepared.inputs)[empty])}"]
    if "dq" in result.grads:
        parts.append(f"dq={classify(result.grads['dq'].cpu()[empty])}")
        dk, dv = _state(result.checks["dk"]), _state(result.checks["dv"])
        parts.append(f"dk,dv={dk}" if dk == dv else f"dk={dk} dv={dv}")
    else:
        parts.append(f"grads={result.row(BWD).status}")
    return Answer(OBSERVED, " ".join(parts), result.reasons, list(result.checks.values()))


@_on_spec_run
def scale_honoured(probe: Probe, prepared: PreparedCase, result: BackendResult) -> Answer:
    """Is a non-default `scale` used (versus silently 1/sqrt(head_dim))? Judged on rows that see keys."""
    check = _judge_visible(result.out, prepared.reference.out, prepared, probe.backend)
    if check.passed:
        return Answer(OBSERVED, "honoured", checks=[check])
    default = reference_attention(replace(prepared.case, scale=None), prepared.inputs, grads=False).out.cpu()
    if _judge_visible(result.out, default, prepared, probe.backend).passed:
        return Answer(OBSERVED, "ignored (used 1/sqrt(head_dim))", checks=[check])
    return Answer(OBSERVED, f"wrong (err {check.err:.3g})", checks=[check])


@_on_spec_run
def nan_in_masked_kv(probe: Probe, prepared: PreparedCase, result: BackendResult) -> Answer:
    """NaN written into K or V at keys the mask hides: does it reach rows that see other keys?"""
    case = prepared.case
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
    return Answer(OBSERVED, " ".join(parts))


def _native(probe: Probe, native: str) -> Answer | None:
    """The answer when the backend lacks the `native_<native>` probe, else None."""
    if native not in probe.backend.native_probes:
        return Answer(UNSUPPORTED, "", f"{probe.backend.name} has no native_{native} probe: it takes mask specs only")
    return None


def _which(probe: Probe, case: AttentionCase, candidates: dict[str, MaskSpec | None]) -> Answer:
    """Call native_causal on `case` and name the candidate mask whose reference it matches."""
    if refusal := skip(probe, case) or _native(probe, "causal"):
        return refusal
    prepared = {name: probe.prepared(replace(case, mask=m)) for name, m in candidates.items()}
    inputs = next(iter(prepared.values())).inputs                       # same seed and shapes: same inputs
    out, why = probe.call(case, inputs, entry="native_causal")
    if out is None:
        return Answer(OBSERVED, "refused", why)
    return matching({name: judge("out", out, p.reference.out, case.dtype, p.naive_error("out", probe.backend.name))
                     for name, p in prepared.items()})


def causal_non_square(probe: Probe) -> tuple[AttentionCase, Answer]:
    """The library's causal flag with seq_q=5 < seq_k=9: top-left, bottom-right, or refused."""
    case = AttentionCase(2, 2, 5, 16, probe_dtype(probe.backend, probe.device), seq_k=9)
    return case, _which(probe, case, {"top-left": Causal(), "bottom-right": CausalBottomRight()})


def decode_causal(probe: Probe) -> tuple[AttentionCase, Answer]:
    """Causal flag on a decode step (seq_q=1 over 9 keys): does the query see every key (causal off, FA2)?"""
    case = AttentionCase(2, 2, 1, 16, probe_dtype(probe.backend, probe.device), seq_k=9)
    return case, _which(probe, case, {"sees all keys (causal off)": None, "sees key 0 only (top-left)": Causal()})


def _on_mask_runs(answer: Callable[[Probe, PreparedCase, dict], Answer]) -> Callable:
    """A question answered from native_mask with the semantics case's mask as bool, additive -inf and additive
    finfo.min tensors: {form: (output or None, why not)}, once per probe cache."""

    @wraps(answer, assigned=("__module__", "__name__", "__qualname__", "__doc__"))
    def question(probe: Probe) -> tuple[AttentionCase, Answer]:
        case = semantics_case(probe_dtype(probe.backend, probe.device))
        if refusal := _native(probe, "mask"):  # ask has already refused a backend that cannot run `case`
            return case, refusal
        prepared = probe.prepared(case)

        def run():
            dense = case.key_mask(probe.device)                         # (B, 1, Sq, Sk)
            zeros = torch.zeros(dense.shape, dtype=case.dtype, device=probe.device)
            forms = {"bool": dense, "additive": zeros.masked_fill(~dense, float("-inf")),
                     "finfo.min": zeros.masked_fill(~dense, torch.finfo(case.dtype).min)}
            return {name: probe.call(case, prepared.inputs, entry="native_mask", mask=mask)
                    for name, mask in forms.items()}

        outs = cached(probe.cache, ("mask", probe.backend, str(probe.device), probe.seed), run)
        return case, answer(probe, prepared, outs)

    del question.__wrapped__  # as in _on_spec_run
    return question


@_on_mask_runs
def mask_kinds(probe: Probe, prepared: PreparedCase, outs: dict) -> Answer:
    """Does the library take a bool mask (True = attend) and an additive one, with the right result?"""
    parts, reasons, checks = [], [], []
    for name in ("bool", "additive"):
        out, why = outs[name]
        if out is None:
            parts.append(f"{name}=refused")
            reasons.append(f"{name}: {why}")
            continue
        checks.append(_judge_visible(out, prepared.reference.out, prepared, probe.backend))
        parts.append(f"{name}={_state(checks[-1])}")
    return Answer(OBSERVED, " ".join(parts), "; ".join(reasons), checks)


@_on_mask_runs
def finite_negative_mask(probe: Probe, prepared: PreparedCase, outs: dict) -> Answer:
    """Masking with finfo(dtype).min instead of -inf: rows that see keys, and rows masked entirely."""
    out, why = outs["finfo.min"]
    if out is None:
        return Answer(OBSERVED, "refused", why)
    check = _judge_visible(out, prepared.reference.out, prepared, probe.backend)
    empty = empty_rows(prepared.case)
    full = classify(out[empty], mean_v(prepared.case, prepared.inputs)[empty])
    return Answer(OBSERVED, f"partial rows={_state(check)} masked rows={full}", checks=[check])


def _candidate(case: AttentionCase, inputs: Inputs, *, cap_after_mask: bool = False, alibi=None) -> torch.Tensor:
    """Float64 attention under one convention: the cap before (spec) or after the mask, and an ALiBi term
    alibi(i, j, seq_q, seq_k) (None: no ALiBi). Empty rows give 0."""
    g = case.heads // case.kv_heads
    q, k, v = (t.to("cpu", torch.float64) for t in inputs[:3])
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) * case.scale
    if case.softcap is not None and not cap_after_mask:
        s = softcap_scores(s, case.softcap)
    if alibi is not None:
        i, j = torch.arange(case.seq_q).view(-1, 1), torch.arange(case.seq_k).view(1, -1)
        s = s + alibi_slopes(case.heads).double().view(-1, 1, 1) * alibi(i, j, case.seq_q, case.seq_k)
    allowed = case.key_mask()
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    if case.softcap is not None and cap_after_mask:
        s = softcap_scores(s, case.softcap)
    visible = torch.isfinite(s).any(-1, keepdim=True)
    return torch.softmax(s.masked_fill(~visible, 0.0), -1).masked_fill(~visible, 0.0) @ v


def _modifier_run(probe: Probe, case: AttentionCase, answer: Callable) -> Answer:
    """answer(prepared, out) of the backend's translation of `case`; not called when the backend cannot run it."""
    if refusal := skip(probe, case):
        return refusal
    prepared = probe.prepared(case)
    out, why = probe.call(case, prepared.inputs)
    return Answer(OBSERVED, "refused", why) if out is None else answer(prepared, out)


def _convention(probe: Probe, case: AttentionCase, candidates: dict) -> Answer:
    """Name the candidate (name -> float64 output of the inputs) that the backend's output matches."""
    return _modifier_run(probe, case, lambda prepared, out: matching({
        name: judge("out", out, ref(prepared.inputs), case.dtype, prepared.naive_error("out", probe.backend.name))
        for name, ref in candidates.items()}))


def softcap_order(probe: Probe) -> tuple[AttentionCase, Answer]:
    """Softcap before the mask (the spec: masked keys stay -inf) or after it (they become -c and get weight)?"""
    case = AttentionCase(2, 2, 5, 16, probe_dtype(probe.backend, probe.device), seq_k=7, mask=PADDING, softcap=2.0)
    return case, _convention(probe, case, {
        "before the mask": lambda x: _candidate(case, x),
        "after the mask": lambda x: _candidate(case, x, cap_after_mask=True)})


def alibi_convention(probe: Probe) -> tuple[AttentionCase, Answer]:
    """ALiBi with seq_q=5 != seq_k=9, no mask: FA2's bottom-right |i + Sk - Sq - j| (the spec), top-left |i - j|,
    attention-gym's (j - i) (not symmetric), or the sign flipped?"""
    case = AttentionCase(2, 4, 5, 16, probe_dtype(probe.backend, probe.device), seq_k=9, alibi=True)
    conventions = {"bottom-right symmetric (FA2)": lambda i, j, sq, sk: -(i + sk - sq - j).abs(),
                   "top-left symmetric": lambda i, j, sq, sk: -(i - j).abs(),
                   "kv_idx - q_idx (attention-gym)": lambda i, j, sq, sk: (j - i).double(),
                   "sign flipped": lambda i, j, sq, sk: (i + sk - sq - j).abs()}
    return case, _convention(probe, case, {name: (lambda x, f=f: _candidate(case, x, alibi=f))
                                      for name, f in conventions.items()})


def sink_empty_rows(probe: Probe) -> tuple[AttentionCase, Answer]:
    """A row that sees no key, with a sink: 0 (the sink takes all the weight), NaN, mean(V) or garbage?"""
    case = AttentionCase(2, 2, 5, 16, probe_dtype(probe.backend, probe.device), seq_k=7, mask=PADDING, sinks=True)
    empty = empty_rows(case)
    return case, _modifier_run(probe, case, lambda prepared, out: Answer(
        OBSERVED, f"out={classify(out.cpu()[empty], mean_v(case, prepared.inputs)[empty])}"))


#: question name -> (phase of its row, probe); one list for `ask` and every caller
QUESTIONS: dict[str, tuple[str, Callable]] = {
    "fully-masked-rows": (FWD_BWD, fully_masked_rows), "causal-non-square": (FWD, causal_non_square),
    "decode-causal": (FWD, decode_causal), "finite-negative-mask": (FWD, finite_negative_mask),
    "mask-kinds": (FWD, mask_kinds), "scale": (FWD, scale_honoured), "nan-in-masked-kv": (FWD, nan_in_masked_kv),
    # the modifiers' questions (the cap's place, ALiBi's convention, a sink on an empty row)
    "softcap-order": (FWD, softcap_order), "alibi-convention": (FWD, alibi_convention),
    "sink-empty-rows": (FWD, sink_empty_rows)}


def ask(question: str, backend: Backend, device: torch.device, *, seed: int = 0, run_id: str = "",
        executor: Executor | None = None, cache: LRU | None = None) -> Row:
    """One question's answer for one backend as a row 'semantics:<question>:<case id>'; `cache`: the probe cache."""
    if question not in QUESTIONS:
        raise ValueError(f"unknown semantics question {question!r}; allowed: {', '.join(QUESTIONS)}")
    phase, question_fn = QUESTIONS[question]
    probe = Probe(backend, device, seed, executor if executor is not None else make_executor(), cache)
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
