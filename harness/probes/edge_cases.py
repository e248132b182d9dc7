"""Edge cases that must be correct: a case plus how its inputs reach the backend, judged like any case."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from harness.backends.base import Backend
from harness.calls.cache import LRU, cached
from harness.isolation.executor import Executor
from harness.run.runner import execute, prepare_case
from harness.cases.case import AttentionCase, Inputs, make_inputs
from harness.cases.masks import parse_mask
from harness.cases.matrices import RUNTIME_CLASSES
from harness.store.schema import Row

#: what a backend's KnownFailure names this probe (its cases: an EdgeCase's name; strict xfail: a fix shows as a pass)
PROBE = "edge"
ARRANGEMENTS = ("plain", "noncontig", "fused-qkv", "expanded-kv", "nan-tail")
#: the runtime classes that run probes (a smoke matrix runs none)
TIERS = RUNTIME_CLASSES[1:]
#: extra NaN-filled positions past the end of K/V storage in 'nan-tail' (more than a typical 16-key tile edge)
NAN_TAIL = 37


@dataclass(frozen=True)
class EdgeCase:
    """A named edge case: the case, how its inputs are arranged (ARRANGEMENTS: it is the execution.bound.Arrangement
    of its inputs), how they are scaled, its tier."""

    name: str
    case: AttentionCase
    arrange: str = "plain"
    #: multipliers of q, k, v (randn x 3 is xformers' peaky-softmax input)
    magnitude: tuple[float, float, float] = (1.0, 1.0, 1.0)
    #: 'default' runs in the default matrix, 'full' only in --matrix full
    tier: str = "default"
    #: also run in the default matrix for backends that compile every new shape (flex: seconds each)
    compiled_default: bool = False

    def __post_init__(self):
        if self.arrange not in ARRANGEMENTS:
            raise ValueError(f"EdgeCase.arrange={self.arrange!r}; allowed: {', '.join(ARRANGEMENTS)}")
        if self.tier not in TIERS:
            raise ValueError(f"EdgeCase.tier={self.tier!r}; allowed: {', '.join(TIERS)}")
        if self.arrange == "expanded-kv" and self.case.kv_heads != 1:
            raise ValueError(f"expanded-kv needs an MQA case (kv_heads=1); got kv_heads={self.case.kv_heads}")
        same_shape = self.case.seq_q == self.case.seq_k and self.case.kv_heads == self.case.heads
        if self.arrange == "fused-qkv" and not same_shape:
            raise ValueError(f"fused-qkv needs q, k, v of one shape; got {self.case.id}")

    @property
    def tag(self) -> str:
        return f"edge:{self.name}"

    @property
    def id(self) -> str:
        return f"{self.tag}:{self.case.id}"

    def inputs(self, q, k, v, layout: str):
        """q, k, v as they reach the backend: views of the leaf tensors, so gradients reach them."""
        seq_dim = 2 if layout == "bhsd" else 1
        head_dim = 3 - seq_dim
        if self.arrange == "noncontig":
            q, k, v = _relaid(q), _relaid(k), _relaid(v)
        elif self.arrange == "fused-qkv":
            d = q.shape[-1]
            packed = torch.cat([q, k, v], dim=-1)                         # (..., 3 * head_dim), as a QKV projection
            q, k, v = packed[..., :d], packed[..., d:2 * d], packed[..., 2 * d:]
        elif self.arrange == "expanded-kv":
            heads = q.shape[head_dim]
            k, v = (t.expand(*[heads if i == head_dim else n for i, n in enumerate(t.shape)]) for t in (k, v))
        elif self.arrange == "nan-tail":                                  # storage runs on past seq_k, in NaN
            pad = (0, 0) * (3 - seq_dim) + (0, NAN_TAIL)
            k, v = (F.pad(t, pad, value=float("nan")).narrow(seq_dim, 0, t.shape[seq_dim]) for t in (k, v))
        return q, k, v

    def output(self, out: torch.Tensor) -> torch.Tensor:
        return _NonContiguousGrad.apply(out) if self.arrange == "noncontig" and out.requires_grad else out


class _NonContiguousGrad(torch.autograd.Function):
    """Identity whose backward hands the gradient on as a non-contiguous view: dO reaches the backend strided."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return _relaid(grad)


def _relaid(t: torch.Tensor) -> torch.Tensor:
    """Same values and shape, storage ordered with dims 1 and 2 swapped: non-contiguous, last dim still dense."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def edge_inputs(edge: EdgeCase, device: torch.device, seed: int = 0) -> Inputs:
    """The case's usual inputs, q/k/v multiplied by edge.magnitude (in float32, then cast: no double rounding)."""
    case = edge.case
    base = make_inputs(case, "cpu", seed)
    if edge.magnitude == (1.0, 1.0, 1.0):
        return base.map(lambda t: t.to(device))
    # make_inputs draws in float32 before casting, so the float32 draw of the same seed is the unrounded value
    exact = make_inputs(replace(case, dtype=torch.float32), "cpu", seed)
    scaled = [(t * m).to(case.dtype) for t, m in zip(exact[:3], edge.magnitude)]
    return Inputs(*(t.to(device) for t in (*scaled, base.d_out)))


def run_edge(edge: EdgeCase, backend: Backend, device: torch.device, *, seed: int = 0, run_id: str = "",
             executor: Executor | None = None, cache: LRU | None = None) -> list[Row]:
    """Rows 'edge:...' of `backend` on the edge case, judged; its reference is kept in `cache` (prepared cases)."""
    arrangement = None if edge.arrange == "plain" else edge
    prepared = cached(cache, (edge, str(device), seed),
                      lambda: prepare_case(edge.case, device, inputs=edge_inputs(edge, device, seed)))
    return execute(backend, prepared, run_id, arrangement=arrangement, executor=executor, tag=edge.tag).rows


def _case(dtype: str, seq_q: int, head_dim: int = 64, mask: str = "none", *, batch: int = 2, heads: int = 4,
          kv_heads: int | None = None, seq_k: int | None = None) -> AttentionCase:
    seq_k = seq_q if seq_k is None else seq_k
    return AttentionCase(batch, heads, seq_q, head_dim, dtype, kv_heads=kv_heads, seq_k=seq_k,
                         mask=parse_mask(mask, batch=batch, seq_k=seq_k))


def edge_cases(tier: str = "default") -> list[EdgeCase]:
    """The edge cases of a tier ('full' includes 'default', which adds only what the default matrix lacks)."""
    if tier not in TIERS:
        raise ValueError(f"tier={tier!r}; allowed: {', '.join(TIERS)}")
    cases = [
        EdgeCase("seq", _case("fp32", 2, mask="causal")),
        EdgeCase("seq", _case("fp32", 1025, mask="causal", batch=1, heads=2)),
        *(EdgeCase("head-dim", _case("bf16", 129, d, "causal")) for d in (160, 192, 224)),
        EdgeCase("gqa-cross-keypad", _case("fp32", 17, mask="keypad", kv_heads=2, heads=8, seq_k=33)),
        EdgeCase("mqa-cross-keypad", _case("bf16", 17, mask="keypad", kv_heads=1, heads=8, seq_k=33)),
        EdgeCase("cross-keypad", _case("fp32", 17, mask="keypad", seq_k=129)),
        EdgeCase("noncontig", _case("fp32", 33, mask="causal-br", seq_k=47), "noncontig", compiled_default=True),
        EdgeCase("fused-qkv", _case("bf16", 65, mask="causal"), "fused-qkv"),
        EdgeCase("expanded-kv", _case("fp32", 33, mask="causal", kv_heads=1), "expanded-kv"),
        EdgeCase("nan-tail", _case("fp32", 33, mask="keypad", seq_k=40), "nan-tail"),
        EdgeCase("randn3", _case("bf16", 129, mask="causal"), magnitude=(3.0, 3.0, 3.0)),
        EdgeCase("randn10", _case("fp32", 129), magnitude=(10.0, 10.0, 10.0)),
        # fp16 near overflow, every true result inside its range: scores of +-150 overflow exp() without the row max;
        EdgeCase("fp16-large-scores", _case("fp16", 64, mask="causal"), magnitude=(6.0, 6.0, 1.0)),
        # unscaled q.k up to ~1e5, past 65504, while scale * q.k stays finite (naive's known failure);
        EdgeCase("fp16-qk-overflow", _case("fp16", 64, mask="causal"), magnitude=(48.0, 48.0, 1.0)),
        # |V| ~ 1e4, outputs and gradients ~1.4e4, and dO @ V^T past 65504 inside the backward (naive's too).
        EdgeCase("fp16-large-v", _case("fp16", 64, mask="causal"), magnitude=(1.0, 1.0, 4000.0)),
    ]
    if tier == "full":
        seqs = (1, 2, 17, 113, 127, 129, 1023, 1025)
        cases += [EdgeCase("seq", _case(dt, s, mask=m, batch=1, heads=2), tier="full")
                  for dt in ("fp32", "bf16") for s in seqs for m in ("none", "causal")]
        cases += [EdgeCase("head-dim", _case(dt, 113, d, "causal"), tier="full")
                  for dt in ("fp32", "fp16", "bf16") for d in (40, 59, 80, 96, 111, 160, 192, 224, 256)]
        cases += [EdgeCase("gqa", _case(dt, 127, mask=m, heads=8, kv_heads=kv, seq_k=203), tier="full")
                  for dt in ("fp32", "bf16") for kv in (1, 2, 8) for m in ("causal-br", "keypad")]
        cases += [EdgeCase(arr, _case(dt, 129, mask="causal", kv_heads=1 if arr == "expanded-kv" else None), arr,
                           tier="full")
                  for dt in ("fp16", "bf16") for arr in ("noncontig", "fused-qkv", "expanded-kv")]
        cases += [EdgeCase("nan-tail", _case(dt, 113, mask=m, seq_k=203), "nan-tail", tier="full")
                  for dt in ("fp16", "bf16") for m in ("keypad", "causal-br")]
        # not randn x 10 in bf16: scores ~300 round by 2, so the naive baseline exceeds its own bound (unjudgeable)
        cases += [EdgeCase(f"randn{m:g}", _case(dt, 257, mask="causal"), magnitude=(m, m, m), tier="full")
                  for dt, m in (("fp32", 3.0), ("fp16", 3.0), ("bf16", 3.0), ("fp32", 10.0), ("fp16", 10.0))]
        cases += [EdgeCase("cross-keypad", _case(dt, sq, mask="keypad", seq_k=sk), tier="full")
                  for dt in ("fp16", "bf16") for sq, sk in ((1, 239), (239, 1023), (1023, 17))]
    return list(dict.fromkeys(cases))
