"""The one row builder: every producer (correctness, benchmark, probes, studies) makes its rows here."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Sequence

import torch

from harness.oracle.verdict import Check
from harness.cases.case import AttentionCase, dtype_name
from harness.store.environment import git_state
from harness.store.host import device_name, testbed_id
from harness.store.schema import Row


def case_columns(case: AttentionCase, device: torch.device | str) -> dict:
    """The columns that describe a case (its id, sizes, dtype, mask, modifiers, scale) and the device it ran on."""
    return {"case_id": case.id, "batch": case.batch, "heads": case.heads, "kv_heads": case.kv_heads,
            "seq_q": case.seq_q, "seq_k": case.seq_k, "head_dim": case.head_dim, "head_dim_v": case.head_dim_v,
            "dtype": dtype_name(case.dtype), "mask": case.mask_id, "modifiers": case.modifier_id, "scale": case.scale,
            "device": str(device), "page_size": case.page_size, "fp8_kv": case.fp8_kv,
            "fp8_q": True if case.fp8_q else None}


def check_columns(checks: Sequence[Check]) -> dict:
    """err/tol (and the naive baseline's err) per judged quantity, the worst err/tol ratio, and NaN/inf."""
    out: dict = {}
    for check in checks:
        out |= {f"{check.quantity}_err": check.err, f"{check.quantity}_tol": check.tol}
        if check.naive_err is not None:
            out[f"naive_{check.quantity}_err"] = check.naive_err
    if checks:
        out["err_ratio"] = max(c.ratio for c in checks)
        out["nonfinite"] = any(c.nonfinite for c in checks)
    return out


def provenance(device: torch.device) -> dict:
    """Where and when: the device's name and testbed, torch, the project's git sha, a UTC timestamp."""
    return {"device_name": device_name(device), "testbed_id": testbed_id(device), "torch_version": torch.__version__,
            "git_sha": git_state()[0], "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def make_row(*, run_id: str, case: AttentionCase, backend: str, backend_version: str, phase: str, device: torch.device,
             status: str | None, reason: str | None = "", checks: Sequence[Check] = (), tag: str = "",
             **columns) -> Row:
    """A results row about `case` run by `backend` on `device`. `tag` prefixes the case id ('semantics:x' ->
    'semantics:x:<case id>': a probe's rows apart from the matrix's under the same case); `columns` set any other
    schema column (a measurement's, `observed`, `backend_op`, or case columns a stand-in case cannot carry)."""
    base = case_columns(case, device)
    if tag:
        base["case_id"] = f"{tag}:{base['case_id']}"
    return Row(run_id=run_id, backend=backend, phase=phase, status=status, reason=reason,
               backend_version=backend_version, **{**base, **provenance(device), **check_columns(checks), **columns})
