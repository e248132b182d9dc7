"""Semantics questions about the attention modifiers (observed rows, not failures): where the cap goes relative to
the mask, which ALiBi convention a backend follows, and what a sink does to a row that sees no key.

Each question runs the backend's own translation of a modifier case (`forward` with the modifier keywords) and
names the candidate convention whose float64 result it matches; the candidates other than the spec's are written
here, as the conventions other libraries use, not in the spec.
"""

from __future__ import annotations

import torch

from harness.oracle.verdict import judge
from harness.probes.common import classify, probe_dtype
from harness.probes.probe import Answer, skip
from harness.spec.case import AttentionCase, Inputs
from harness.spec.masks import KeyPadding
from harness.spec.modifiers import alibi_slopes, softcap_scores
from harness.store.schema import FWD, OBSERVED

#: batch element 0 sees no key (empty rows), element 1 its first 4 of 7
PADDING = KeyPadding((0, 4))


def _candidate(case: AttentionCase, inputs: Inputs, *, cap_after_mask: bool = False, alibi=None) -> torch.Tensor:
    """Float64 attention of `inputs` under one convention: the cap before (spec) or after the mask, and an ALiBi
    term alibi(i, j, seq_q, seq_k) -> distance penalty (None: the case has no ALiBi). Empty rows give 0."""
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


def _which(probe, case: AttentionCase, candidates: dict):
    """Run the backend's translation of `case` and name the candidate (name -> float64 output) it matches; a backend
    that does not declare the modifier is not called (unsupported, with its reason)."""
    refusal = skip(probe, case)
    if refusal:
        return refusal
    prepared = probe.prepared(case)
    out, why = probe.call(case, prepared.inputs)
    if out is None:
        return Answer(OBSERVED, "refused", why)
    naive = prepared.naive_error("out", probe.backend.name)
    checks = {name: judge("out", out, ref(prepared.inputs), case.dtype, naive) for name, ref in candidates.items()}
    for name, check in checks.items():
        if check.passed:
            return Answer(OBSERVED, name, checks=[check])
    errs = ", ".join(f"{name} {c.err:.3g}" for name, c in checks.items())
    return Answer(OBSERVED, "neither", f"err vs {errs}", list(checks.values()))


def softcap_order(probe) -> tuple[AttentionCase, object]:
    """Softcap before the mask (the spec: masked keys stay -inf) or after it (they become -c and get weight)?"""
    case = AttentionCase(2, 2, 5, 16, probe_dtype(probe.backend, probe.device), seq_k=7, mask=PADDING, softcap=2.0)
    return case, _which(probe, case, {
        "before the mask": lambda x: _candidate(case, x),
        "after the mask": lambda x: _candidate(case, x, cap_after_mask=True)})


def alibi_convention(probe) -> tuple[AttentionCase, object]:
    """ALiBi with seq_q=5 != seq_k=9, no mask: FA2's bottom-right |i + Sk - Sq - j| (the spec), top-left |i - j|,
    attention-gym's (j - i) (not symmetric), or the sign flipped?"""
    case = AttentionCase(2, 4, 5, 16, probe_dtype(probe.backend, probe.device), seq_k=9, alibi=True)
    conventions = {"bottom-right symmetric (FA2)": lambda i, j, sq, sk: -(i + sk - sq - j).abs(),
                   "top-left symmetric": lambda i, j, sq, sk: -(i - j).abs(),
                   "kv_idx - q_idx (attention-gym)": lambda i, j, sq, sk: (j - i).double(),
                   "sign flipped": lambda i, j, sq, sk: (i + sk - sq - j).abs()}
    return case, _which(probe, case, {name: (lambda x, f=f: _candidate(case, x, alibi=f))
                                      for name, f in conventions.items()})


def sink_empty_rows(probe) -> tuple[AttentionCase, object]:
    """A row that sees no key, with a sink: 0 (the sink takes all the weight), NaN, mean(V) or garbage?"""
    case = AttentionCase(2, 2, 5, 16, probe_dtype(probe.backend, probe.device), seq_k=7, mask=PADDING, sinks=True)
    refusal = skip(probe, case)
    if refusal:
        return case, refusal
    prepared = probe.prepared(case)
    out, why = probe.call(case, prepared.inputs)
    if out is None:
        return case, Answer(OBSERVED, "refused", why)
    empty = ~case.key_mask().any(-1).expand(case.batch, case.heads, case.seq_q)
    v = prepared.inputs.v.to("cpu", torch.float64).repeat_interleave(case.heads // case.kv_heads, dim=1)
    mean_v = v.mean(2, keepdim=True).expand(case.batch, case.heads, case.seq_q, case.head_dim_v)
    return case, Answer(OBSERVED, f"out={classify(out.cpu()[empty], mean_v[empty])}")


#: question name -> (phase of its row, probe), joined to semantics.QUESTIONS
MODIFIER_QUESTIONS = {
    "softcap-order": (FWD, softcap_order),
    "alibi-convention": (FWD, alibi_convention),
    "sink-empty-rows": (FWD, sink_empty_rows),
}
