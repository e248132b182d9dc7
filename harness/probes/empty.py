"""Empty tensors (batch 0, seq_q 0, seq_k 0) per backend, probed in the backend's worker: a crash is a result too."""

from __future__ import annotations

import torch

from harness.backends.base import Backend
from harness.calls.bound import BoundCall
from harness.isolation.executor import CallFailed, Executor
from harness.calls.outcome import exception_text
from harness.probes.common import probe_dtype, probe_row
from harness.cases.case import AttentionCase, dtype_name
from harness.store.schema import ERROR, FAIL, FWD_BWD, PASS, UNSUPPORTED, Row

#: name -> (batch, heads, seq_q, seq_k, head_dim)
SHAPES: dict[str, tuple[int, int, int, int, int]] = {"batch0": (0, 2, 5, 7, 16), "seq_q0": (2, 2, 0, 7, 16),
                                                     "seq_k0": (2, 2, 5, 0, 16)}

#: what a backend's KnownFailure names this probe (its cases: the SHAPES; strict xfail: a fix shows as a pass)
PROBE = "empty"


def probe(backend: Backend, device: torch.device, shape: str) -> dict:
    """Forward and backward on one empty shape of an available backend (probe_all asks first), where called:
    {'status', 'observed', 'reason', 'op'}."""
    if shape not in SHAPES:
        raise ValueError(f"unknown empty shape {shape!r}; allowed: {', '.join(SHAPES)}")
    b, h, sq, sk, d = SHAPES[shape]
    dtype = probe_dtype(backend, device)
    gen = torch.Generator().manual_seed(0)
    canon = [torch.randn(s, generator=gen).to(device, dtype) for s in ((b, h, sq, d), (b, h, sk, d), (b, h, sk, d))]
    grad = not backend.backward_reasons(device)
    q, k, v = (backend.to_layout(t).contiguous().requires_grad_(grad) for t in canon)
    # the backend's plan for an unmasked call depends on no size: the nearest non-empty case gives it
    stand_in = AttentionCase(max(b, 1), h, max(sq, 1), d, dtype, seq_k=max(sk, 1))  # unmasked, scale d ** -0.5
    try:
        call = BoundCall(backend, stand_in, device)
        out = call(q, k, v)
        out_c = backend.from_layout(out.detach())
        if grad:
            out.backward(torch.ones_like(out))
    except Exception as exc:  # refusing an empty problem cleanly is allowed
        return dict(status=UNSUPPORTED, observed="refused", reason=exception_text(exc))
    problems = []
    if tuple(out_c.shape) != (b, h, sq, d):
        problems.append(f"output shape {tuple(out_c.shape)} != {(b, h, sq, d)}")
    elif not bool(torch.isfinite(out_c).all()):
        problems.append("output has NaN/inf (rows with no key should be 0)")
    elif sk == 0 and bool((out_c != 0).any()):
        problems.append("output rows with no key are not 0")
    for name, t in zip("qkv", (q, k, v)) if grad else ():
        g = t.grad
        if g is not None and (g.shape != t.shape or not bool(torch.isfinite(g).all())):
            problems.append(f"d{name} has shape {tuple(g.shape)} or NaN/inf")
    observed = f"out {tuple(out_c.shape)}" + ("" if grad else "; no backward")
    return dict(status=FAIL if problems else PASS, observed=observed, reason="; ".join(problems), op=call.ops(grad)[0])


def probe_all(backends: list[Backend], device: torch.device, executor: Executor) -> dict:
    """{(backend name, shape): outcome} through `executor` (isolated: a backend that dies ends only its worker)."""
    results = {}
    for backend in backends:
        refused = executor.refusal(backend, device)
        for shape in SHAPES:
            if refused:
                results[(backend.name, shape)] = dict(status=refused[0], observed="", reason=refused[1])
                continue
            try:
                results[(backend.name, shape)] = executor.run(backend, probe, device, shape)
            except CallFailed as exc:
                results[(backend.name, shape)] = dict(status=ERROR, observed="crash",
                                                      reason=f"{exc.failure.reason} (instead of raising an exception)")
    return results


def empty_row(backend: Backend, shape: str, outcome: dict, device: torch.device, run_id: str = "") -> Row:
    """CSV row 'edge:empty-<shape>:<dtype>-b..-h..-s..x..-d16' for one outcome of `probe_all`."""
    b, h, sq, sk, d = SHAPES[shape]
    dtype = probe_dtype(backend, device)
    stand_in = AttentionCase(max(b, 1), h, max(sq, 1), d, dtype, seq_k=max(sk, 1))
    # the stand-in case only carries the other columns; the real sizes include the zero
    return probe_row(stand_in, backend, device, tag="", phase=FWD_BWD, **outcome, run_id=run_id,
                     batch=b, seq_q=sq, seq_k=sk,
                     case_id=f"edge:empty-{shape}:{dtype_name(dtype)}-b{b}-h{h}-s{sq}x{sk}-d{d}")
