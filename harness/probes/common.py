"""Shared plumbing of the probes: their dtype, rows and refusals, a question's Probe and Answer, classifying values."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.backends.base import Backend
from harness.calls.cache import LRU, cached
from harness.calls.call import Call
from harness.isolation.executor import Executor, make_executor
from harness.run.runner import prepare_case, refusal
from harness.oracle.prepared import PreparedCase
from harness.oracle.verdict import FLOORS, Check
from harness.cases.case import AttentionCase, Inputs
from harness.store.rows import make_row
from harness.store.schema import JUDGED, OBSERVED, UNSUPPORTED, Row

#: how close to mean(V) a block must be to be called so: ten fp16 floors (the least precise dtype a probe uses)
MEAN_V_TOLERANCE = 10 * FLOORS[torch.float16]


def probe_dtype(backend: Backend, device: torch.device) -> torch.dtype:
    """fp32 on CPU (least rounding noise); fp16 on GPU, which every fused kernel takes; else its first dtype."""
    preferred = torch.float16 if device.type == "cuda" else torch.float32
    return preferred if backend.dtypes is None or preferred in backend.dtypes else backend.dtypes[0]


def probe_row(case: AttentionCase, backend: Backend, device: torch.device, *, tag: str, phase: str, status: str,
              observed: str = "", reason: str = "", checks: list[Check] | None = None, run_id: str = "",
              op: str = "", **columns) -> Row:
    """One row about `case` under `tag` (id 'tag:<case id>'); `op`: the kernel that ran (CallResult.op)."""
    return make_row(run_id=run_id, case=case, backend=backend.name, backend_version=backend.version(), phase=phase,
                    device=device, status=status, reason=reason, checks=checks or (), tag=tag, observed=observed,
                    backend_op=op if status in JUDGED else "", **columns)


def refused(backend: Backend, case: AttentionCase, device: torch.device, executor: Executor | None = None, *,
            backward: bool = False, dropout: bool = False) -> tuple[str, str] | None:
    """(status, reason) when the probe cannot run here: unavailable, or unsupported by the capability data."""
    if gate := refusal(backend, case, device, executor):
        return gate
    if not (backward or dropout):  # refusal asked can_run this very question (a plan may be built to answer it)
        return None
    reasons = backend.can_run(case, device, backward=backward, dropout=dropout)
    return (UNSUPPORTED, "; ".join(reasons)) if reasons else None


def empty_rows(case: AttentionCase) -> torch.Tensor:
    """(B, H, Sq) bool: query rows that see no key."""
    return ~case.key_mask().any(-1).expand(case.batch, case.heads, case.seq_q)


def mean_v(case: AttentionCase, inputs: Inputs) -> torch.Tensor:
    """(B, H, Sq, Dv) float64: each row's uniform average of V over every key (a finite mask on an empty row)."""
    v = inputs.v.to("cpu", torch.float64).repeat_interleave(case.heads // case.kv_heads, dim=1)
    return v.mean(2, keepdim=True).expand(case.batch, case.heads, case.seq_q, case.head_dim_v)


def classify(values: torch.Tensor, mean_v: torch.Tensor | None = None) -> str:
    """What a block of values is: all '0', has 'NaN', has 'inf', equals 'mean(V)' or anything else ('garbage')."""
    x = values.detach().to("cpu", torch.float64)
    if x.numel() == 0 or bool((x == 0).all()):
        return "0"
    if bool(x.isnan().any()):
        return "NaN"
    if bool(x.isinf().any()):
        return "inf"
    if mean_v is not None:
        m = mean_v.detach().to("cpu", torch.float64).expand_as(x)
        atol = MEAN_V_TOLERANCE * max(1.0, float(m.abs().max()))
        if bool(torch.allclose(x, m, rtol=MEAN_V_TOLERANCE, atol=atol)):
            return "mean(V)"
    return "garbage"


@dataclass(frozen=True)
class Probe:
    """Who is asked, where, with which seed, where its calls run, and the run's probe cache (None: no sharing)."""

    backend: Backend
    device: torch.device
    seed: int = 0
    executor: Executor = field(default_factory=make_executor)
    cache: LRU | None = None

    def prepared(self, case: AttentionCase) -> PreparedCase:
        return cached(self.cache, ("prepared", case, str(self.device), self.seed),
                      lambda: prepare_case(case, self.device, self.seed))

    def call(self, case: AttentionCase, inputs: Inputs, **call) -> tuple[torch.Tensor | None, str]:
        """(output in canonical layout, or None; why not) of one call on given inputs, without gradients."""
        answer = self.executor.call(self.backend, Call(case, None, inputs, **call), self.device)
        return (None, answer.failure.reason) if answer.failure is not None else (answer.out, "")


@dataclass
class Answer:
    """A question's answer for one backend: status observed/unsupported/unavailable, the value, why."""

    status: str
    observed: str = ""
    reason: str = ""
    checks: list[Check] = field(default_factory=list)


def skip(probe: Probe, case: AttentionCase) -> Answer | None:
    """The answer when `probe`'s backend cannot run `case` here (unavailable or unsupported), else None."""
    gate = refused(probe.backend, case, probe.device, probe.executor)
    return Answer(gate[0], "", gate[1]) if gate else None


def matching(checks: dict[str, Check]) -> Answer:
    """The first candidate whose check passed, else 'neither' with every candidate's error."""
    for name, check in checks.items():
        if check.passed:
            return Answer(OBSERVED, name, checks=[check])
    errs = ", ".join(f"{name} {c.err:.3g}" for name, c in checks.items())
    return Answer(OBSERVED, "neither", f"err vs {errs}", list(checks.values()))
