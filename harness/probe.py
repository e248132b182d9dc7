"""Shared plumbing of the semantics, edge-case and KV-cache suites: probe dtype, rows with tagged ids, custom inputs."""

from __future__ import annotations

import torch

from harness.backends.base import Backend
from harness.case import AttentionCase, Inputs
from harness.runner import PreparedCase, _row, prepare_case

#: what `classify` can answer about a block of output or gradient values
CLASSES = ("0", "NaN", "inf", "mean(V)", "garbage")


def probe_dtype(backend: Backend, device: torch.device) -> torch.dtype:
    """The dtype a probe uses: fp32 on CPU (least rounding noise); fp16 on GPU, the one dtype every fused GPU
    kernel takes (SDPA flash and FA2 refuse fp32, and a refusal would hide the kernel's semantics). A backend
    that declares neither gets its first declared dtype."""
    preferred = torch.float16 if device.type == "cuda" else torch.float32
    if backend.dtypes is None or preferred in backend.dtypes:
        return preferred
    return backend.dtypes[0]


def exception_text(exc: BaseException) -> str:
    """'Type: first line' of an exception (Unsupported: its message alone), for reasons and observed values."""
    from harness.backends.base import Unsupported

    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return text if isinstance(exc, Unsupported) else f"{type(exc).__name__}: {text}"


def tagged_id(tag: str, case: AttentionCase) -> str:
    """'semantics:fully-masked-rows' + case -> 'semantics:fully-masked-rows:fp32-b2-h2-s5x7-d16-...'.

    The prefix keeps these rows' (case_id, backend, phase) keys apart from the correctness suite's.
    """
    return f"{tag}:{case.id}"


def tag_rows(rows: list[dict], tag: str) -> list[dict]:
    """Rows of `runner.execute` re-keyed under `tag` (same columns otherwise)."""
    for row in rows:
        row["case_id"] = f"{tag}:{row['case_id']}"
    return rows


def probe_row(case: AttentionCase, backend: Backend, device: torch.device, *, tag: str, phase: str, status: str,
              observed: str = "", reason: str = "", checks=None, run_id: str = "") -> dict:
    """One CSV row about `case` under `tag`, built by the runner's own row builder (same provenance columns)."""
    row = _row(PreparedCase(case, device, None, None, None), backend, phase, status, reason, checks, run_id)
    row["case_id"] = tagged_id(tag, case)
    row["observed"] = observed
    return row


def prepare_with_inputs(case: AttentionCase, device: torch.device, inputs: Inputs,
                        reference_inputs: Inputs | None = None) -> PreparedCase:
    """`runner.prepare_case` for inputs we built ourselves (scaled, sliced, poisoned)."""
    return prepare_case(case, device, inputs=inputs, reference_inputs=reference_inputs)


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
        if bool(torch.allclose(x, m, rtol=1e-2, atol=1e-2 * max(1.0, float(m.abs().max())))):
            return "mean(V)"
    return "garbage"
