"""Deployment checks of one backend on one workload: fullgraph compile, CUDA-graph capture, determinism, mask path."""

from __future__ import annotations

import linecache
import math
import re
import sysconfig
import warnings
from pathlib import Path

import torch

from harness.backends.base import Backend, Unsupported
from harness.case import AttentionCase, Inputs, make_inputs
from harness.env import REPO_ROOT
from harness.masks import MASK_NAMES, parse_mask
from harness.perf import InputsOnly, phase_callables
from harness.runner import GRADS, backend_inputs

#: compile checks run on a shrunken copy of the workload (same dtype, head_dim, mask kind, GQA or not):
#: graph breaks follow the code path, which these decide, not the sizes; a full-size inductor compile on CPU
#: would cost far more than the measurement itself.
CHECK_SEQ = 128
CHECK_COLUMNS = ("compiles", "graph_breaks", "compile_note", "cuda_graph", "deterministic", "determinism_note",
                 "mask_path", "dense_mask_bytes", "mask_note")


def check_case(case: AttentionCase) -> AttentionCase:
    """The small case compile checks use: batch <= 2, kv heads <= 2 with groups of <= 2, seq <= CHECK_SEQ.

    A mask that parse_mask cannot rebuild for the new shape (e.g. documents) keeps the full case.
    """
    if case.mask is not None and case.mask_kind not in MASK_NAMES:
        return case
    batch, kv_heads = min(case.batch, 2), min(case.kv_heads, 2)
    heads = kv_heads * min(case.heads // case.kv_heads, 2)
    seq_q, seq_k = min(case.seq_q, CHECK_SEQ), min(case.seq_k, CHECK_SEQ)
    return AttentionCase(batch, heads, seq_q, case.head_dim, case.dtype, kv_heads=kv_heads, seq_k=seq_k,
                         mask=parse_mask(case.mask_kind, batch=batch, seq_k=seq_k),
                         scale=None if case.default_scale else case.scale)


def _is_library(filename: str) -> bool:
    """True for the stdlib's and installed packages' files (torch's included): not where a user's break is."""
    paths = sysconfig.get_paths()
    return filename.startswith((paths["stdlib"], paths["purelib"], paths["platlib"])) or "site-packages" in filename


def _frame(stack) -> object | None:
    """The deepest frame of `stack` outside the stdlib and installed packages (the line that broke the graph)."""
    frames = list(stack or [])
    ours = [f for f in frames if not _is_library(f.filename)]
    return (ours or frames or [None])[-1]


def _where(frame) -> str:
    """'harness/backends/flex.py:94 `start = time.perf_counter()`' for a traceback frame."""
    path = Path(frame.filename)
    short = str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else path.name
    code = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip()
    return f"{short}:{frame.lineno}" + (f" `{code[:80]}`" if code else "")


def _break_summary(message: str, frame) -> str:
    # Dynamo's first line is generic ("Attempted to call function marked as skipped"); the first sentence of its
    # Explanation line says why.
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    why = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Explanation:")),
               lines[0] if lines else "")
    why = re.split(r"(?<=[.`])\s+(?=[A-Z])", why)[0][:140]
    return (f"{_where(frame)}: " if frame is not None else "") + why


def compile_check(backend: Backend, case: AttentionCase, device: torch.device, *, training: bool,
                  compile_backend: str = "inductor") -> dict:
    """{compiles: yes/no/error, graph_breaks, compile_note} for backend.forward under torch.compile(fullgraph=True).

    With `training` the backward of the compiled call runs too. 'no' is a graph break (dynamo's Unsupported): the
    count is torch._dynamo.explain's, at least 1 (explain undercounts once an inner compiled call is cached), or
    NaN when dynamo captured no graph at all (the whole call runs eagerly); the note names the line that broke.
    'error' is any other failure (e.g. the compiler backend's), with its message.
    """
    small = check_case(case)
    q, k, v, d_out = backend_inputs(backend, make_inputs(small, device), requires_grad=training)

    def call(q, k, v):
        return backend.forward(q, k, v, mask=small.mask, scale=small.scale)

    # A fresh dynamo cache per check: `call` is one code object for every backend, so an earlier backend's
    # guards and the recompile limit would otherwise decide this one.
    torch._dynamo.reset()
    with warnings.catch_warnings():  # dynamo warns about the very breaks this check reports
        warnings.simplefilter("ignore")
        return _compile_and_explain(call, (q, k, v), d_out if training else None, compile_backend, small.id)


def _compile_and_explain(call, args: tuple, d_out: torch.Tensor | None, compile_backend: str, where: str) -> dict:
    """compile_check without its setup: fullgraph first, explain only when that refused."""
    try:
        out = torch.compile(call, fullgraph=True, backend=compile_backend)(*args)
        if d_out is not None:
            out.backward(d_out)
        return {"compiles": "yes", "graph_breaks": 0, "compile_note": f"{compile_backend}, on {where}"}
    except torch._dynamo.exc.Unsupported as exc:
        note = _break_summary(str(exc), _frame(getattr(exc, "real_stack", None)))
    except Exception as exc:  # not a graph break: the compiler (or the compiled call) failed
        torch._dynamo.reset()
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        return {"compiles": "error", "graph_breaks": math.nan, "compile_note": f"{type(exc).__name__}: {first}"}
    try:
        torch._dynamo.reset()
        explained = torch._dynamo.explain(call)(*args)
        count, graphs = explained.graph_break_count, explained.graph_count
    except Exception:  # explain itself failed; the fullgraph refusal above still stands
        count, graphs = 1, 1
    finally:
        torch._dynamo.reset()
    if count < 0 or graphs == 0:
        return {"compiles": "no", "graph_breaks": math.nan, "compile_note": f"no graph captured (runs eagerly): {note}"}
    return {"compiles": "no", "graph_breaks": max(count, 1), "compile_note": note}


def cuda_graph_check(backend: Backend, case: AttentionCase, device: torch.device, inputs: Inputs, *,
                     training: bool) -> str:
    """'yes' when the timed phase captures into a CUDA graph and replays; 'n/a (cpu)' off the GPU."""
    if device.type != "cuda":
        return f"n/a ({device.type})"
    from harness.timing import _graphed  # the harness's own --cuda-graph capture, so "capturable" means that works

    setup, fn = phase_callables(backend, InputsOnly(case, device, inputs), "fwd+bwd" if training else "fwd")
    setup = setup or (lambda: None)
    try:
        replay = _graphed(fn, setup, device)
        setup()
        replay()
        torch.cuda.synchronize(device)
        return "yes"
    except Exception as exc:
        return f"no: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}"


def determinism_check(backend: Backend, case: AttentionCase, device: torch.device, inputs: Inputs, *,
                      training: bool) -> tuple[str, str]:
    """('yes' | 'no' | 'error', note): the timed phase run twice on identical inputs, results compared bitwise.

    Training compares the output and dq/dk/dv of forward+backward; inference the forward output.
    """
    runs = []
    try:
        for _ in range(2):
            q, k, v, d_out = backend_inputs(backend, inputs, requires_grad=training)
            out = backend.forward(q, k, v, mask=case.mask, scale=case.scale)
            result = {"out": out.detach()}
            if training:
                out.backward(d_out)
                result.update({name: t.grad for name, t in zip(GRADS, (q, k, v))})
            runs.append(result)
    except Exception as exc:
        return "error", f"{type(exc).__name__}: {str(exc).strip()[:160]}"
    compared = "out, dq, dk, dv" if training else "out"
    differ = [f"{name} (max |diff| {float((runs[1][name].double() - first.double()).abs().max()):.3g})"
              for name, first in runs[0].items() if not torch.equal(first, runs[1][name])]
    if differ:
        return "no", "differs over 2 runs: " + ", ".join(differ)
    return "yes", f"{compared} bitwise equal over 2 runs"


def _dense_bytes(t: torch.Tensor) -> int:
    """Bytes of a mask tensor at its full logical shape, or its storage when larger (xformers pads rows to 8):
    an expanded view costs its full size as soon as a kernel makes it contiguous or converts it to a bias."""
    return max(t.numel() * t.element_size(), t.untyped_storage().nbytes())


def mask_path(backend: Backend, case: AttentionCase, device: torch.device) -> dict:
    """{mask_path: native/dense/none/unsupported/unknown, dense_mask_bytes, mask_note}, read off the form the
    backend module's own translation function gives for the case's mask (never re-derived here)."""
    if case.mask is None:
        return {"mask_path": "none", "dense_mask_bytes": 0, "mask_note": "no mask"}
    module = type(backend).__module__
    translate = _TRANSLATIONS.get(module)
    if translate is None:
        return {"mask_path": "unknown", "dense_mask_bytes": math.nan,
                "mask_note": f"no known mask translation for {module}.{type(backend).__name__}"}
    try:
        return translate(backend, case, device)
    except Unsupported as exc:
        return {"mask_path": "unsupported", "dense_mask_bytes": math.nan, "mask_note": str(exc)[:160]}
    except Exception as exc:  # e.g. xformers not importable: its translation cannot be asked
        return {"mask_path": "unknown", "dense_mask_bytes": math.nan,
                "mask_note": f"translation failed: {type(exc).__name__}: {str(exc).strip()[:120]}"}


def _dense(t: torch.Tensor, what: str) -> dict:
    return {"mask_path": "dense", "dense_mask_bytes": _dense_bytes(t),
            "mask_note": f"{what} {str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}"}


def _naive_form(backend, case, device):
    # naive's forward materializes the spec itself: always dense
    return _dense(case.key_mask(device), "materialized mask")


def _sdpa_form(backend, case, device):
    from harness.backends.sdpa import sdpa_mask_args

    args = sdpa_mask_args(case.mask, case.seq_q, case.seq_k, case.batch, device)
    if "attn_mask" in args:
        return _dense(args["attn_mask"], "attn_mask")
    return {"mask_path": "native", "dense_mask_bytes": 0, "mask_note": ", ".join(f"{k}={v}" for k, v in args.items())}


def _xformers_form(backend, case, device):
    from harness.backends.xformers import xformers_bias

    group = case.heads // case.kv_heads
    shape = ((case.batch, case.kv_heads, group, case.seq_q, case.seq_k) if group > 1
             else (case.batch, case.heads, case.seq_q, case.seq_k))  # the bias shapes Xformers.forward builds
    bias = xformers_bias(case.mask, shape, case.dtype, device)
    if isinstance(bias, torch.Tensor):
        return _dense(bias, "tensor attn_bias")
    tensors = [t for t in vars(bias).values() if isinstance(t, torch.Tensor)] if hasattr(bias, "__dict__") else []
    if tensors:  # a typed mask carrying a tensor bias (causal + padding): the tensor part is dense
        return {"mask_path": "dense", "dense_mask_bytes": sum(_dense_bytes(t) for t in tensors),
                "mask_note": f"{type(bias).__name__} with a tensor bias {tuple(tensors[0].shape)}"}
    return {"mask_path": "native", "dense_mask_bytes": 0, "mask_note": type(bias).__name__}


def _fa2_form(backend, case, device):
    from harness.backends.flash_attn import fa2_args

    args = fa2_args(case.mask, case.seq_q, case.seq_k)
    shown = {k: v for k, v in args.items() if k in ("causal", "window_size")}
    varlen = " + varlen" if any(k in args for k in ("key_lengths", "cu_seqlens_q")) else ""
    return {"mask_path": "native", "dense_mask_bytes": 0,
            "mask_note": ", ".join(f"{k}={v}" for k, v in shown.items()) + varlen}


def _flex_form(backend, case, device):
    from harness.backends.flex import flex_mask_mod

    flex_mask_mod(case.mask, case.seq_q, case.seq_k, device)  # the spec's predicate as a mask_mod: block-sparse
    return {"mask_path": "native", "dense_mask_bytes": 0, "mask_note": "mask_mod -> BlockMask"}


_TRANSLATIONS = {"harness.backends.naive": _naive_form, "harness.backends.sdpa": _sdpa_form,
                 "harness.backends.xformers": _xformers_form, "harness.backends.flash_attn": _fa2_form,
                 "harness.backends.flex": _flex_form}


def deployment_checks(backend: Backend, case: AttentionCase, device: torch.device, *, training: bool, seed: int = 0,
                      compile_backend: str = "inductor") -> dict:
    """Every check column for a verified backend: compile (small shape), CUDA graph and determinism (workload shape)."""
    inputs = make_inputs(case, device, seed)
    deterministic, note = determinism_check(backend, case, device, inputs, training=training)
    return {**compile_check(backend, case, device, training=training, compile_backend=compile_backend),
            "cuda_graph": cuda_graph_check(backend, case, device, inputs, training=training),
            "deterministic": deterministic, "determinism_note": note, **mask_path(backend, case, device)}
