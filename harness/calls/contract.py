"""What a backend's answer must be (the Backend contract): an output of the case's dtype, device and shape that is
the call's own, gradients shaped like their leaves, and the inputs left as given."""

from __future__ import annotations

import torch

from harness.calls.outcome import Failure
from harness.oracle.verdict import bits as _bits  # inputs compared bit for bit: NaN in padding equals itself
from harness.store.schema import ERROR, FAIL


class Snapshot:
    """Bit-exact copies of named tensors, to tell afterwards which of them a call wrote into."""

    def __init__(self, tensors: dict[str, torch.Tensor | None]):
        self._kept = {name: (t, _bits(t).clone()) for name, t in tensors.items() if t is not None}

    def written(self, given: dict[str, torch.Tensor] | None = None) -> str:
        """'' when every tensor still holds what it held - those `given` names, its bits instead (what was written into
        them since) -; else which were written, and how many elements."""
        changed, given = [], given or {}
        for name, (t, before) in self._kept.items():
            now, before = _bits(t), _bits(given[name]) if name in given else before
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


def contract_violation(out: object, q: torch.Tensor, v: torch.Tensor,
                       dtype: torch.dtype) -> Failure | None:
    """Why `out` breaks the Backend contract (a strided tensor of `dtype` on q's device, shaped like q with v's head
    dim), or None: a non-tensor is an error, a wrong tensor a fail."""
    if not isinstance(out, torch.Tensor):
        return Failure(ERROR, f"forward returned {type(out).__name__}, not a tensor")
    expected = (*q.shape[:-1], v.shape[-1])
    problems = [] if type(out) is torch.Tensor else [not_plain(out)]
    if out.dtype != dtype:
        problems.append(f"output dtype {str(out.dtype).removeprefix('torch.')}, expected "
                        f"{str(dtype).removeprefix('torch.')} "
                        f"({'the input dtype' if dtype == q.dtype else 'the case dtype: q is FP8'})")
    if out.device != q.device:
        problems.append(f"output on {out.device}, expected {q.device} (the inputs' device)")
    if out.layout != torch.strided:
        problems.append(f"output layout {out.layout}, expected torch.strided")
    if tuple(out.shape) != tuple(expected):
        problems.append(f"output shape {tuple(out.shape)}, expected {tuple(expected)}")
    return Failure(FAIL, "; ".join(problems)) if problems else None


def owned(path: str, out: object, q: torch.Tensor, v: torch.Tensor, given: dict[str, torch.Tensor],
          snapshot: Snapshot, dtype: torch.dtype) -> Failure | None:
    """contract_violation, then inputs left as given and the output owned; `path` prefixes the reason."""
    failure = contract_violation(out, q, v, dtype)
    if failure is None:
        problem = "; ".join(filter(None, [snapshot.written(), aliased(out, given)]))
        failure = Failure(FAIL, problem) if problem else None
    return None if failure is None else Failure(failure.status, path + failure.reason)


def not_plain(value: torch.Tensor) -> str:
    """Why an answer of a torch.Tensor subclass is refused: its own code runs whenever the harness reads it - after
    the clock stopped, where deferred work would go unseen (docs/integrity.md)."""
    return (f"returned a {type(value).__qualname__}, a subclass of torch.Tensor: an answer must be exactly "
            "torch.Tensor (a subclass runs code of its own when read, after the clock stopped)")


def grad_violation(name: str, grad: torch.Tensor, leaf: torch.Tensor) -> str | None:
    if type(grad) is not torch.Tensor:
        return f"{name} {not_plain(grad)}"
    if grad.dtype != leaf.dtype or tuple(grad.shape) != tuple(leaf.shape) or grad.device != leaf.device:
        return (f"{name} is {str(grad.dtype).removeprefix('torch.')} {tuple(grad.shape)} on {grad.device}, expected "
                f"{str(leaf.dtype).removeprefix('torch.')} {tuple(leaf.shape)} on {leaf.device}")
    return None
