"""Semantics questions: real answers of SDPA's math kernel, and planted behaviours each recognised for what it is."""

import pytest
import torch
import torch.nn.functional as F

from harness.backends import Backend, get_backends
from harness.backends.base import Unsupported
from harness.probes.common import classify
from harness.probes.semantics import QUESTIONS, ask

CPU = torch.device("cpu")


class Planted(Backend):
    """SDPA math underneath; subclasses change one behaviour. Not registered: tests hand it over directly."""

    name = "planted"

    def forward(self, q, k, v, *, mask, scale):
        dense = None if mask is None else mask.materialize(q.shape[2], k.shape[2], q.device, batch=q.shape[0])
        return self.attend(q, k, v, dense, scale)

    def attend(self, q, k, v, dense, scale):
        """Plain softmax attention; rows without keys come out NaN (softmax of all -inf)."""
        scores = (q @ k.transpose(-1, -2)) * scale
        if dense is not None:
            scores = scores.masked_fill(~dense, float("-inf"))
        return torch.softmax(scores, -1) @ v


class FiniteMin(Planted):
    def attend(self, q, k, v, dense, scale):                  # masks with finfo.min instead of -inf
        scores = (q @ k.transpose(-1, -2)) * scale
        return torch.softmax(scores.masked_fill(~dense, torch.finfo(q.dtype).min), -1) @ v


class IgnoresScale(Planted):
    def forward(self, q, k, v, *, mask, scale):
        return super().forward(q, k, v, mask=mask, scale=q.shape[-1] ** -0.5)


class DoublesScale(Planted):
    def forward(self, q, k, v, *, mask, scale):
        return super().forward(q, k, v, mask=mask, scale=2 * scale)


class ZeroesMaskedValues(FiniteMin):
    def attend(self, q, k, v, dense, scale):                  # drops hidden keys before any arithmetic
        visible = dense.any(2, keepdim=True).transpose(-1, -2)   # (B, 1, Sk, 1)
        k, v = k.masked_fill(~visible, 0), v.masked_fill(~visible, 0)
        out = super().attend(q, k, v, dense, scale)
        return out.masked_fill(~dense.any(-1, keepdim=True), 0)


class BottomRightFlag(Planted):
    native_probes = frozenset({"causal"})

    def native_causal(self, q, k, v, *, scale):
        sq, sk = q.shape[2], k.shape[2]
        dense = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
        return self.attend(q, k, v, dense, scale)


class RefusesCausal(Planted):
    native_probes = frozenset({"causal"})

    def native_causal(self, q, k, v, *, scale):
        raise RuntimeError("causal needs seq_q == seq_k")


class InvertsBoolMask(Planted):
    native_probes = frozenset({"mask"})

    def native_mask(self, q, k, v, *, mask, scale):
        if mask.dtype == torch.bool:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=~mask, scale=scale)   # True = ignore
        raise Unsupported("no additive masks")


class CudaOnly(Planted):
    devices = ("cuda",)


def answer(backend, question):
    row = ask(question, backend, CPU)
    return row.status, row.observed, row.reason


@pytest.mark.parametrize("question, expected", [
    ("fully-masked-rows", "out=0 dq=0 dk,dv=ok"),            # documented since torch 2.5
    ("causal-non-square", "top-left"),                         # documented: is_causal is top-left
    ("decode-causal", "sees key 0 only (top-left)"),
    ("finite-negative-mask", "partial rows=ok masked rows=mean(V)"),
    ("mask-kinds", "bool=ok additive=ok"),
    ("scale", "honoured"),
])
def test_sdpa_math_answers(question, expected):
    status, observed, _ = answer(get_backends("sdpa-math")[0], question)
    assert (status, observed) == ("observed", expected)


def test_every_question_gives_a_row_with_the_tagged_id():
    backend = get_backends("sdpa-math")[0]
    for question in QUESTIONS:
        row = ask(question, backend, CPU)
        assert row.case_id.startswith(f"semantics:{question}:fp32-b2-h")
        if question == "softcap-order":  # SDPA has no softcap: the question is not put to it
            assert row.status == "unsupported" and "softcap" in row.reason
        else:
            assert row.status == "observed" and row.observed


def test_nan_rows_are_recognised():
    # softmax of an all -inf row is NaN; masked_fill's backward zeroes dq there, but P^T dO spreads NaN into dV
    assert answer(Planted(), "fully-masked-rows")[:2] == ("observed", "out=NaN dq=0 dk=ok dv=NaN")


def test_finite_mask_value_gives_mean_of_v():
    assert answer(FiniteMin(), "fully-masked-rows")[1].startswith("out=mean(V)")


def test_ignored_and_wrong_scale_are_told_apart():
    assert answer(IgnoresScale(), "scale")[1] == "ignored (used 1/sqrt(head_dim))"
    assert answer(DoublesScale(), "scale")[1].startswith("wrong (err")


def test_nan_containment_seen_for_k_and_v():
    assert answer(ZeroesMaskedValues(), "nan-in-masked-kv")[1] == "K=contained V=contained"
    assert answer(Planted(), "nan-in-masked-kv")[1] == "K=contained V=leaks"


def test_causal_flag_alignment_and_refusal():
    assert answer(BottomRightFlag(), "causal-non-square")[1] == "bottom-right"
    assert answer(BottomRightFlag(), "decode-causal")[1] == "sees all keys (causal off)"
    status, observed, reason = answer(RefusesCausal(), "causal-non-square")
    assert (status, observed) == ("observed", "refused") and "seq_q == seq_k" in reason


def test_inverted_bool_mask_is_wrong_and_refusal_recorded():
    status, observed, reason = answer(InvertsBoolMask(), "mask-kinds")
    assert observed.startswith("bool=wrong") and "additive=refused" in observed and "no additive masks" in reason


def test_backend_without_probe_is_unsupported_with_reason():
    status, observed, reason = answer(Planted(), "mask-kinds")
    assert (status, observed) == ("unsupported", "") and "no native_mask probe" in reason


def test_unavailable_backend_row_says_why():
    status, _, reason = answer(CudaOnly(), "scale")
    assert status == "unavailable" and "cuda" in reason


def test_unknown_question_names_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown semantics question 'alignment'; allowed: fully-masked-rows"):
        ask("alignment", Planted(), CPU)


@pytest.mark.parametrize("values, expected", [
    (torch.zeros(3, 4), "0"),
    (torch.tensor([[0.0, float("nan")]]), "NaN"),
    (torch.tensor([[1.0, float("inf")]]), "inf"),
    (torch.full((2, 3), 0.5), "mean(V)"),
    (torch.tensor([[0.1, -3.0, 2.0]]), "garbage"),
])
def test_classify(values, expected):
    assert classify(values, torch.full(values.shape, 0.5)) == expected
