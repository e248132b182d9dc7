"""Shared plumbing of the probes: the dtype a probe uses, the refusal rows, and classifying a block of values."""

from __future__ import annotations

import torch

from harness.backends.base import Backend
from harness.execution.executor import Executor, make_executor
from harness.execution.runner import refusal
from harness.oracle.verdict import FLOORS, Check
from harness.spec.case import AttentionCase
from harness.store.rows import make_row
from harness.store.schema import JUDGED, UNSUPPORTED, Row

#: how close to mean(V) a block must be to be called so: ten of the verdict's floors of fp16, the least precise
#: dtype a probe uses (probe_dtype)
MEAN_V_TOLERANCE = 10 * FLOORS[torch.float16]


def probe_dtype(backend: Backend, device: torch.device) -> torch.dtype:
    """The dtype a probe uses: fp32 on CPU (least rounding noise); fp16 on GPU, the one dtype every fused GPU
    kernel takes (SDPA flash and FA2 refuse fp32, and a refusal would hide the kernel's semantics). A backend
    that declares neither gets its first declared dtype."""
    preferred = torch.float16 if device.type == "cuda" else torch.float32
    if backend.dtypes is None or preferred in backend.dtypes:
        return preferred
    return backend.dtypes[0]


def probe_row(case: AttentionCase, backend: Backend, device: torch.device, *, tag: str, phase: str, status: str,
              observed: str = "", reason: str = "", checks: list[Check] | None = None, run_id: str = "",
              op: str = "", **columns) -> Row:
    """One row about `case` under `tag` (the id 'tag:<case id>' keeps it apart from the matrix's rows); `op` names
    the kernel that ran, as the call's result brought it back from where it ran (CallResult.op)."""
    return make_row(run_id=run_id, case=case, backend=backend.name, backend_version=backend.version(), phase=phase,
                    device=device, status=status, reason=reason, checks=checks or (), tag=tag, observed=observed,
                    backend_op=op if status in JUDGED else "", **columns)


def refused(backend: Backend, case: AttentionCase, device: torch.device, executor: Executor | None = None, *,
            backward: bool = False, dropout: bool = False) -> tuple[str, str] | None:
    """(status, reason) when the probe cannot run here: unavailable, or unsupported by the capability data."""
    executor = executor if executor is not None else make_executor()
    gate = refusal(backend, case, device, executor)
    if gate:
        return gate
    reasons = backend.can_run(case, device, backward=backward, dropout=dropout)
    return (UNSUPPORTED, "; ".join(reasons)) if reasons else None


def classify(values: torch.Tensor, mean_v: torch.Tensor | None = None) -> str:
    """What a block of values is: all '0', has 'NaN', has 'inf', equals 'mean(V)' (a uniform softmax over every
    key, what a finite mask value gives an empty row) or anything else ('garbage')."""
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
