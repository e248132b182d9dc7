"""Deployment checks of one backend on one workload: fullgraph compile, CUDA-graph capture, determinism, mask path."""

from __future__ import annotations

import linecache
import math
import re
import sysconfig
import warnings
from pathlib import Path

import torch

from harness.backends.base import Backend, MaskForm, Unsupported
from harness.calls.bound import BoundCall, backend_inputs
from harness.calls.round import TimedRound
from harness.calls.outcome import exception_text
from harness.cases.case import AttentionCase, Inputs, make_inputs
from harness.cases.masks import MASK_NAMES, parse_mask
from harness.store.environment import REPO_ROOT
from harness.store.schema import FWD, FWD_BWD, GRADS

#: compile checks run on a shrunken copy of the workload (same dtype, head_dim, mask kind, GQA or not): graph
#: breaks follow the code path, not the sizes, and a full-size inductor compile on CPU costs more than measuring
CHECK_SEQ = 128
CHECK_COLUMNS = ("compiles", "graph_breaks", "compile_note", "cuda_graph", "deterministic", "determinism_note",
                 "mask_path", "dense_mask_bytes", "mask_note")


def check_case(case: AttentionCase) -> AttentionCase:
    """The small case compile checks use: batch <= 2, kv heads <= 2 with groups of <= 2, seq <= CHECK_SEQ; a mask
    that parse_mask cannot rebuild for the new shape (e.g. documents) keeps the full case."""
    if case.mask is not None and case.mask_kind not in MASK_NAMES:
        return case
    batch, kv_heads = min(case.batch, 2), min(case.kv_heads, 2)
    heads = kv_heads * min(case.heads // case.kv_heads, 2)
    seq_q, seq_k = min(case.seq_q, CHECK_SEQ), min(case.seq_k, CHECK_SEQ)
    return AttentionCase(batch, heads, seq_q, case.head_dim, case.dtype, kv_heads=kv_heads, seq_k=seq_k,
                         mask=parse_mask(case.mask_kind, batch=batch, seq_k=seq_k, seq_q=seq_q),
                         scale=None if case.default_scale else case.scale)


def _break_note(exc: Exception) -> str:
    """'harness/backends/flex.py:94 `start = time.perf_counter()`: why' for dynamo's refusal: the deepest frame
    outside the stdlib and installed packages (torch's included), then the first sentence of its Explanation line
    (its first line is generic: "Attempted to call function marked as skipped")."""
    paths = sysconfig.get_paths()
    frames = list(getattr(exc, "real_stack", None) or [])
    ours = [f for f in frames if not f.filename.startswith((paths["stdlib"], paths["purelib"], paths["platlib"]))
            and "site-packages" not in f.filename]
    frame = (ours or frames or [None])[-1]
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    why = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Explanation:")),
               lines[0] if lines else "")
    why = re.split(r"(?<=[.`])\s+(?=[A-Z])", why)[0][:140]
    if frame is None:
        return why
    path = Path(frame.filename)
    short = str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else path.name
    code = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip()
    return f"{short}:{frame.lineno}" + (f" `{code[:80]}`" if code else "") + f": {why}"


def compile_check(backend: Backend, case: AttentionCase, device: torch.device, *, training: bool,
                  compile_backend: str = "inductor") -> dict:
    """{compiles: yes/no/error, graph_breaks, compile_note} for backend.forward under torch.compile(fullgraph=True)
    (with `training`, its backward too). 'no' is a graph break: the count is torch._dynamo.explain's, at least 1
    (explain undercounts once an inner compiled call is cached), or NaN when dynamo captured no graph (the call runs
    eagerly); the note names the line that broke. 'error' is any other failure, with its message."""
    small = check_case(case)
    q, k, v, d_out = backend_inputs(backend, small, make_inputs(small, device), requires_grad=training)
    bound = BoundCall(backend, small, device)  # prepare runs before compiling: only the call is compiled

    def call(q, k, v):
        return bound(q, k, v)

    # A fresh dynamo cache per check: `call` is one code object for every backend, so an earlier backend's
    # guards and the recompile limit would otherwise decide this one.
    torch._dynamo.reset()
    with warnings.catch_warnings():  # dynamo warns about the very breaks this check reports
        warnings.simplefilter("ignore")
        try:
            out = torch.compile(call, fullgraph=True, backend=compile_backend)(q, k, v)
            if training:
                out.backward(d_out)
            return {"compiles": "yes", "graph_breaks": 0, "compile_note": f"{compile_backend}, on {small.id}"}
        except torch._dynamo.exc.Unsupported as exc:
            note = _break_note(exc)
        except Exception as exc:  # not a graph break: the compiler (or the compiled call) failed
            torch._dynamo.reset()
            return {"compiles": "error", "graph_breaks": math.nan, "compile_note": exception_text(exc, 200)}
        try:  # explain only when fullgraph refused
            torch._dynamo.reset()
            explained = torch._dynamo.explain(call)(q, k, v)
            count, graphs = explained.graph_break_count, explained.graph_count
        except Exception:  # explain itself failed; the fullgraph refusal above still stands
            count, graphs = 1, 1
        finally:
            torch._dynamo.reset()
    eager = count < 0 or graphs == 0
    return {"compiles": "no", "graph_breaks": math.nan if eager else max(count, 1),
            "compile_note": f"no graph captured (runs eagerly): {note}" if eager else note}


def cuda_graph_check(backend: Backend, case: AttentionCase, device: torch.device, inputs: Inputs, *,
                     training: bool) -> str:
    """'yes' when the timed phase captures into a CUDA graph and replays; 'n/a (cpu)' off the GPU."""
    if device.type != "cuda":
        return f"n/a ({device.type})"
    # the harness's own --cuda-graph capture, so "capturable" means that works
    try:
        TimedRound(backend, case, FWD_BWD if training else FWD, device, inputs).capture(device).call()
        torch.cuda.synchronize(device)
        return "yes"
    except Exception as exc:
        return f"no: {exception_text(exc, 160)}"


def determinism_check(backend: Backend, case: AttentionCase, device: torch.device, inputs: Inputs, *,
                      training: bool) -> tuple[str, str]:
    """('yes' | 'no' | 'error', note): the timed phase run twice on identical inputs, the output (and with
    `training` dq, dk, dv) compared bitwise."""
    runs = []
    try:
        call = BoundCall(backend, case, device)
        for _ in range(2):
            q, k, v, d_out = backend_inputs(backend, case, inputs, requires_grad=training)
            out = call(q, k, v)
            result = {"out": out.detach()}
            if training:
                out.backward(d_out)
                result.update({name: t.grad for name, t in zip(GRADS, (q, k, v))})
            runs.append(result)
    except Exception as exc:
        return "error", exception_text(exc, 160)
    differ = [f"{name} (max |diff| {float((runs[1][name].double() - first.double()).abs().max()):.3g})"
              for name, first in runs[0].items() if not torch.equal(first, runs[1][name])]
    if differ:
        return "no", "differs over 2 runs: " + ", ".join(differ)
    return "yes", f"{'out, dq, dk, dv' if training else 'out'} bitwise equal over 2 runs"


def mask_path(backend: Backend, device: torch.device, case: AttentionCase) -> dict:
    """{mask_path: native/dense/none/unsupported/unknown, dense_mask_bytes, mask_note}, read off the form the
    backend module's own translation gives for the case's mask (Backend.mask_form; never re-derived here)."""
    if case.mask is None:
        return MaskForm("none", 0, "no mask").as_columns()
    try:
        return backend.mask_form(case, device).as_columns()
    except Unsupported as exc:
        return MaskForm("unsupported", math.nan, str(exc)[:160]).as_columns()
    except Exception as exc:  # e.g. xformers not importable: its translation cannot be asked
        return MaskForm("unknown", math.nan, f"translation failed: {exception_text(exc, 120)}").as_columns()


def deployment_checks(backend: Backend, device: torch.device, case: AttentionCase, training: bool, seed: int = 0,
                      compile_backend: str = "inductor") -> dict:
    """Every check column for a verified backend: compile (small shape), CUDA graph and determinism (workload shape)."""
    inputs = make_inputs(case, device, seed)
    deterministic, note = determinism_check(backend, case, device, inputs, training=training)
    return {**compile_check(backend, case, device, training=training, compile_backend=compile_backend),
            "cuda_graph": cuda_graph_check(backend, case, device, inputs, training=training),
            "deterministic": deterministic, "determinism_note": note, **mask_path(backend, device, case)}
