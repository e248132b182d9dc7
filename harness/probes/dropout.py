"""Dropout through a backend's native_dropout probe: judged statistically, its RNG stream only recorded."""

from __future__ import annotations

import hashlib
import math

import torch

from harness.backends.base import Backend
from harness.calls.call import Call
from harness.isolation.executor import Executor, make_executor
from harness.oracle.reference import reference_attention
from harness.oracle.verdict import FLOORS
from harness.probes.common import probe_dtype, probe_row, refused
from harness.cases.case import AttentionCase, Inputs, make_inputs
from harness.store.schema import BWD, ERROR, FAIL, FWD, PASS, UNSUPPORTED, Row

P = 0.25
REPEATS = 8
#: standard deviations allowed: a correct backend fails a check with probability ~6e-7
Z = 5.0
#: relative tolerance of a kept weight against P / (1 - p): the verdict's floor, ten of them in fp16/bf16 (the kept
#: weight is rounded to the input dtype once more than the reference)
RTOL = {dtype: floor * (10 if dtype in (torch.float16, torch.bfloat16) else 1) for dtype, floor in FLOORS.items()}
#: weights below this are left out of the kept-fraction count: in fp16/bf16 they may round to 0 when kept
_MIN_WEIGHT = 1e-3


class _Refused(Exception):
    """A dropout call gave no output; the message is the backend's reason."""


def check_dropout(backend: Backend, device: torch.device, *, seed: int = 0, run_id: str = "",
                  executor: Executor | None = None) -> list[Row]:
    """Rows 'dropout:<case id>' fwd (statistics; RNG recorded in `observed`) and bwd (dV uses the forward mask)."""
    executor = executor if executor is not None else make_executor()
    case = AttentionCase(2, 4, 32, 32, probe_dtype(backend, device))  # head_dim = seq_k, so V can be the identity

    def rows(fwd: tuple[str, str, str], bwd: tuple[str, str, str] | None = None, op: str = "") -> list[Row]:
        bwd = bwd or fwd
        return [probe_row(case, backend, device, tag="dropout", phase=phase, status=s, observed=obs, reason=why,
                          run_id=run_id, op=op) for phase, (s, obs, why) in ((FWD, fwd), (BWD, bwd))]

    if gate := refused(backend, case, device, executor, dropout=True):
        return rows((gate[0], "", gate[1]))
    q, k, _, d_out = make_inputs(case, device, seed)[:4]
    eye = torch.eye(case.seq_k, dtype=case.dtype, device=device)
    inputs = Inputs(q, k, eye.expand(case.batch, case.kv_heads, case.seq_k, case.head_dim).contiguous(), d_out)
    probs = reference_attention(case, inputs, grads=False).out.cpu()    # V = I: the undropped attention weights

    def run(rng_seed: int, grad: bool = False):
        """One seeded native_dropout call: (out, dV or None, the kernel that ran); the global RNG is left alone."""
        call = Call(case, None, inputs, entry="native_dropout", p=P, backward=grad, rng_seed=rng_seed)
        answer = executor.call(backend, call, device)
        failure = answer.failure or answer.backward_failure
        if failure is not None:
            raise _Refused(failure.reason)
        return answer.out, answer.grads.get("dv"), answer.op

    try:
        outs = [run(seed + r)[0].double() for r in range(REPEATS)]
        again, _, op = run(seed)
        again = again.double()
    except _Refused as exc:  # a library that refuses dropout here (e.g. a kernel without it) says so
        return rows((UNSUPPORTED, "refused", str(exc)))

    counted = probs > _MIN_WEIGHT
    kept = torch.stack([o != 0 for o in outs])
    n = int(counted.sum()) * REPEATS
    frac = float(kept[:, counted].sum()) / n
    bound = Z * math.sqrt(P * (1 - P) / n)
    expected = probs / (1 - P)
    rel = max(float(torch.where(o != 0, (o - expected).abs() / expected.clamp_min(1e-30), 0.0).max()) for o in outs)
    sums = torch.stack([o.sum(-1) for o in outs]).flatten()
    sum_bound = Z * float(sums.std()) / math.sqrt(sums.numel())
    mean = float(sums.mean())
    failures = [why for bad, why in (
        (abs(frac - (1 - P)) > bound, f"kept fraction {frac:.4f} outside {1 - P} +- {bound:.4f}"),
        (rel > RTOL[case.dtype], f"kept weights differ from P/(1-p) by {rel:.3g} (relative) > {RTOL[case.dtype]:g}"),
        (abs(mean - 1) > sum_bound, f"biased: mean row sum {mean:.4f} outside 1 +- {sum_bound:.4f}")) if bad]
    digest = hashlib.sha1(kept[0].numpy().tobytes()).hexdigest()[:12]
    observed = (f"kept {frac:.4f} (1-p={1 - P}, bound {bound:.4f}); mean row sum {mean:.4f}; "
                f"seed {seed} mask sha1 {digest}; same seed repeats: {'yes' if torch.equal(again, outs[0]) else 'no'}")
    fwd = (FAIL if failures else PASS, observed, "; ".join(failures))

    no_backward = backend.backward_reasons(device)
    if no_backward:
        return rows(fwd, (UNSUPPORTED, "", "; ".join(no_backward)), op)
    try:
        out, dv, op = run(seed, grad=True)
    except _Refused as exc:
        return rows(fwd, (ERROR, "", str(exc)), op)
    out64, dv64 = out.to("cpu", torch.float64), dv.to("cpu", torch.float64)
    expected_dv = out64.transpose(-1, -2) @ inputs.d_out.to("cpu", torch.float64)   # P_dropped^T dO
    err = float((dv64 - expected_dv).abs().max())
    tol = RTOL[case.dtype] * 10 * max(1.0, float(expected_dv.abs().max()))
    bwd = (PASS if err <= tol else FAIL, f"max|dV - P_dropped^T dO| = {err:.3g} (tol {tol:.3g})",
           "" if err <= tol else "backward does not use the forward's dropout mask")
    return rows(fwd, bwd, op)
