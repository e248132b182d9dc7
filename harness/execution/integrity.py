"""Integrity checks of what a backend's calls did (docs/integrity.md): inputs, outputs, fresh content, clocks."""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass
from typing import Iterable

import torch

from harness.spec.case import Inputs
from harness.store.schema import BWD

#: same-size integer views: inputs are compared bit for bit (NaN in padding compares equal to itself)
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

#: the clock audit (clock_disagreement): a round is rejected when the run's own clock saw it last longer than the timing
#: process's clocks account for by over CLOCK_SHARE of the round plus CLOCK_SLACK_MS - what a request's trip through the
#: pipe and the scheduler adds: median 12 ms, 99th percentile 54-61 ms, at most 110 ms in 864 honest rounds at a load
#: average of 8-18 on 2 cores (benchmarks/clock_audit_study.py, 2026-12-03); a disagreeing round is timed once more
CLOCK_SHARE = 0.5
CLOCK_SLACK_MS = 100.0
#: the same on CUDA between the events' span over the repetitions and the host clock around them, in one process after
#: synchronisation: only the first launch and the last synchronisation are the host's alone
EVENT_SLACK_MS = 5.0


def run_seed(seed: int | None) -> int:
    """The seed given (to reproduce a run), else one drawn now, which no code can predict."""
    return secrets.randbelow(2 ** 31) if seed is None else seed


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return t.view(_BITS[t.element_size()]) if t.element_size() in _BITS and t.is_floating_point() else t


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same bits (NaN equal to itself, -0.0 unlike 0.0)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


class Snapshot:
    """Bit-exact copies of named tensors, to tell afterwards which of them a call wrote into."""

    def __init__(self, tensors: dict[str, torch.Tensor | None], copies: dict[str, torch.Tensor] | None = None):
        """copies: tensors bit-equal to some of them that no call is given, kept instead of cloning again."""
        copies = copies or {}
        self._kept = {name: (t, _bits(copies[name]) if name in copies else _bits(t).clone())
                      for name, t in tensors.items() if t is not None}

    def rebased(self, copies: dict[str, torch.Tensor]) -> "Snapshot":
        """The same tensors, now expected to hold `copies`' bits where it names them (what was just written in)."""
        new = object.__new__(Snapshot)
        new._kept = {name: (t, _bits(copies[name]) if name in copies else before)
                     for name, (t, before) in self._kept.items()}
        return new

    def written(self) -> str:
        """'' when every tensor still holds what it held; else which were written, and how many elements."""
        changed = []
        for name, (t, before) in self._kept.items():
            now = _bits(t)
            if now.shape != before.shape or not torch.equal(now, before):
                n = (now != before).sum().item() if now.shape == before.shape else now.numel()
                changed.append(f"{name} ({n} of {before.numel()} elements)")
        return f"wrote into its input {', '.join(changed)}" if changed else ""


def aliased(out: torch.Tensor, inputs: dict[str, torch.Tensor | None]) -> str:
    """'' when `out` owns its memory; else which input's storage it shares (an output must be the call's own)."""
    if not isinstance(out, torch.Tensor) or out.numel() == 0:
        return ""
    storage = out.untyped_storage().data_ptr()
    shared = [name for name, t in inputs.items()
              if t is not None and t.numel() and t.untyped_storage().data_ptr() == storage]
    return f"its output aliases its input {', '.join(shared)}" if shared else ""


@dataclass(frozen=True)
class Transform:
    """An exact change of a case's inputs: q and k times `qk` (+-1: scores unchanged bit for bit), v times `v` and
    dO times `d_out` (signed powers of two). out scales by v; dv by d_out; dq and dk by qk * v * d_out; dsinks and
    dbias by v * d_out; the naive baseline's errors (the tolerance) alike. Valid for every case."""

    qk: float = 1.0
    v: float = 1.0
    d_out: float = 1.0

    @property
    def identity(self) -> bool:
        return (self.qk, self.v, self.d_out) == (1.0, 1.0, 1.0)

    def inputs(self, inputs: Inputs) -> Inputs:
        q, k, v, d_out, sinks, bias = inputs
        # a factor of 1 hands the tensor on as it is: whoever gives it to a call copies it (backend_inputs)
        if self.v != 1.0:
            v = v * self.v
        if self.qk != 1.0:
            q, k = q * self.qk, k * self.qk
        return Inputs(q, k, v, d_out * self.d_out, sinks, bias)

    def factor(self, quantity: str) -> float:
        """What `quantity` of the verified answer is multiplied by to give this transform's answer."""
        return {"out": self.v, "dv": self.d_out, "dq": self.qk * self.v * self.d_out,
                "dk": self.qk * self.v * self.d_out}.get(quantity, self.v * self.d_out)

    def describe(self) -> str:
        return f"q,k x{self.qk:g}, v x{self.v:g}, dO x{self.d_out:g}"


#: the transforms drawn from: every answer changes (none of v, dO, qk.v.dO is 1); 17 input sets
TRANSFORMS = tuple(Transform(qk, v, d) for qk in (1.0, -1.0) for v in (-1.0, 2.0, -2.0) for d in (-1.0, 2.0, -2.0)
                   if qk * v * d != 1.0)


@dataclass(frozen=True)
class RoundInputs:
    """A round's inputs: `seen` for every repetition but the last, `new` (every answer unlike seen's) for the last; each
    call's own content is drawn on top (CallContent)."""

    seen: Transform
    new: Transform


#: for an FP8 KV cache (fixed scales): v x 2 may saturate e4m3 where v x -1 is exact; q and k still flip sign
#: (an FP8 q's flip is exact too: quantize(-q) = -quantize(q))
FP8_TRANSFORMS = tuple(Transform(qk, v, d) for qk in (1.0, -1.0) for v in (1.0, -1.0) for d in (-1.0, 2.0, -2.0)
                       if (qk, v) != (1.0, 1.0))


def round_options(case, phase: str) -> dict:
    """round_inputs' keywords for an AttentionCase and a phase."""
    return {"fp8_kv": case.fp8_kv is not None, "backward_alone": phase == BWD}


def round_inputs(seed: int, key: Iterable, round_index: int, *, fp8_kv: bool = False,
                 backward_alone: bool = False) -> RoundInputs:
    """A round's transforms, drawn from the run's seed, its key and its round. backward_alone: new differs in dO alone
    (no new forward: +18 % on naive's bwd)."""
    order = list(FP8_TRANSFORMS if fp8_kv else TRANSFORMS)
    random.Random(f"{seed}:{':'.join(map(str, key))}").shuffle(order)
    seen = order[round_index % len(order)]
    rest = order[round_index % len(order) + 1:] + order[:round_index % len(order)]
    new = next(t for t in rest if t.v != seen.v and t.d_out != seen.d_out
               and t.qk * t.v * t.d_out != seen.qk * seen.v * seen.d_out)
    if backward_alone:
        new = Transform(seen.qk, seen.v, new.d_out)
    return RoundInputs(seen, new)


def clock_disagreement(claimed_ms: float, accounted_ms: float, wall_ms: float,
                       clocks: str = "the backend process's clock disagrees with the run's",
                       slack_ms: float = CLOCK_SLACK_MS) -> str:
    """'' unless the run's clock saw the round (wall_ms, around its request) last longer than the timing process
    accounts for (accounted_ms: its work outside `measure`, measure's besides the samples, and the samples, each by
    its own clock) by over CLOCK_SHARE x accounted_ms + CLOCK_SLACK_MS; claimed_ms: the samples' sum. A clock slowed
    s-fold claims 1/s of every part it reads, so the run sees up to (s - 1) x accounted_ms more: rejected once
    (s - 1 - CLOCK_SHARE) x accounted_ms passes CLOCK_SLACK_MS - a 5x clock of every part on any round of over 143 ms
    of real work (a shorter one's lag is caught by clock_behind as the next request starts). On CUDA the same rule,
    with EVENT_SLACK_MS, holds the events' span over the repetitions to the host clock around them (any round of over
    7 ms with events slowed 5x)."""
    unseen = wall_ms - accounted_ms
    if unseen <= CLOCK_SHARE * accounted_ms + slack_ms:
        return ""
    return (f"{clocks}: {claimed_ms:.3g} ms claimed in {claimed_ms + unseen:.3g} ms of calls (the round: "
            f"{accounted_ms:.4g} ms by the first, {wall_ms:.4g} ms by the second; limit {CLOCK_SHARE:g} x the round + "
            f"{slack_ms:g} ms)")


def clock_behind(started_ns: int, asked_ns: int) -> str:
    """'' unless the timing process's clock read `started_ns` as the round started, before the run's read `asked_ns`
    as it sent the request (one system-wide monotonic clock: never, honestly). A clock slowed at any point since the
    process started - at import, in a call - lags real time by what it slowed, and nothing of the kernel runs between
    a reply and the next request to catch up: any lag over the request's trip shows at the next round."""
    if started_ns >= asked_ns:
        return ""
    return (f"the backend process's clock is behind the run's: the round started {(asked_ns - started_ns) / 1e6:.4g} "
            f"ms before the run asked for it")


#: the signed powers of two a call's v and dO slices are scaled by: exact in every float format (none overflows at 2)
SLICE_SCALES = (-2.0, -1.0, 1.0, 2.0)


@dataclass(frozen=True)
class CallContent:
    """One timed call's own content on top of its round's inputs: a sign per (batch, kv head, head-dim column) of q and
    k together (every product of q.k is unchanged, so the scores are bit for bit), a signed power of two per (batch,
    kv head) of v and of dO - one for all slices where sinks or a bias take gradients (summed over batch and heads),
    signs alone for v in an FP8 KV cache. q heads take their kv head's factors (kv head = q head // group). Every
    answer is the round's answer times an exact factor per slice (`undo` divides it out). Factors: (batch, kv heads,
    1, head dim) for qk, (batch, kv heads, 1, 1) for v and dO; the space is 2^(batch.kv_heads.head_dim) x 16^(batch.
    kv_heads) contents - no memo keyed on any fingerprint of the inputs sees one twice."""

    #: None: left as they are (the backward alone: its graph is built on them)
    qk: torch.Tensor | None
    v: torch.Tensor | None
    d_out: torch.Tensor

    @classmethod
    def draw(cls, case, generator: torch.Generator, *, backward_alone: bool = False,
             uniform: bool = False) -> "CallContent":
        """Fresh factors for `case` from `generator`; backward_alone: q, k and v stay (the graph is built), dO alone
        changes; uniform: one v and one dO factor for every slice (sinks or a bias take gradients)."""
        b, hkv, d = case.batch, case.kv_heads, case.head_dim

        def scales(choices: tuple[float, ...]) -> torch.Tensor:
            shape = (1, 1, 1, 1) if uniform else (b, hkv, 1, 1)
            pick = torch.randint(len(choices), shape, generator=generator)
            return torch.tensor(choices)[pick].expand(b, hkv, 1, 1)

        if backward_alone:
            return cls(None, None, scales(SLICE_SCALES))
        signs = torch.randint(2, (b, hkv, 1, d), generator=generator) * 2.0 - 1.0
        v_choices = (-1.0, 1.0) if case.fp8_kv is not None else SLICE_SCALES
        return cls(signs, scales(v_choices), scales(SLICE_SCALES))

    def inputs(self, inputs: Inputs) -> Inputs:
        q, k, v, d_out, sinks, bias = inputs
        group = q.shape[1] // k.shape[1]
        d_out = d_out * self._q_heads(self.d_out, group).to(d_out)
        if self.qk is None:
            return Inputs(q, k, v, d_out, sinks, bias)
        return Inputs(q * self._q_heads(self.qk, group).to(q), k * self.qk.to(k), v * self.v.to(v), d_out, sinks, bias)

    def undo(self, quantity: str, answer: torch.Tensor, group: int) -> torch.Tensor:
        """`answer` (canonical) divided by its factor: the round's answer, bit for bit when the call's was exact."""
        qk = 1.0 if self.qk is None else self.qk
        v = torch.ones_like(self.d_out) if self.v is None else self.v
        v_d_out = v * self.d_out
        factor = {"out": self._q_heads(v, group), "dv": self.d_out,
                  "dq": self._q_heads(qk * v_d_out, group), "dk": qk * v_d_out}.get(quantity)
        if factor is None:  # dsinks, dbias: uniform factors (draw(uniform=True))
            factor = v_d_out.flatten()[0]
        return answer / factor.to(answer)

    @staticmethod
    def _q_heads(factor: torch.Tensor, group: int) -> torch.Tensor:
        return factor.repeat_interleave(group, dim=1) if group > 1 else factor
