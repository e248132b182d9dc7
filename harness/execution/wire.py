"""The wire format to the workers: torch's pickler, small CPU tensors inline, large ones in shared memory."""

from __future__ import annotations

import collections
import dataclasses
import enum
import io
import pathlib
import pickle
import sys
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401 - registers tensor reductions: large CPU tensors travel in shared memory

#: tensors up to this size travel inline: cheaper than a shared-memory segment below it (benchmarks/worker_transfer.py,
#: four tensors a call: 64 KiB each 1.2 ms inline against 3.8 ms; 256 KiB 7.3 against 5.6; 1 MiB 32 against 8.5)
INLINE_BYTES = 128 * 2 ** 10


def _tensor_from_bytes(dtype: torch.dtype, shape: tuple[int, ...], data: bytes) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


class _Pickler(ForkingPickler):
    """torch's multiprocessing pickler, with small CPU tensors copied into the message."""

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and obj.layout == torch.strided \
                and not obj.requires_grad and obj.nbytes <= INLINE_BYTES:
            data = obj.detach().contiguous().view(torch.uint8).numpy().tobytes() if obj.numel() else b""
            return _tensor_from_bytes, (obj.dtype, tuple(obj.shape), data)
        return NotImplemented


def send(conn, obj: Any) -> None:
    conn.send_bytes(bytes(_Pickler.dumps(obj)))


def recv(conn) -> Any:
    """A message from the run's process (trusted: the worker's side of the pipe)."""
    return pickle.loads(conn.recv_bytes())


#: what a backend's process may make this one build, besides harness's data classes and torch's tensors: values
_SAFE_BUILTINS = frozenset({object, set, frozenset, slice, complex, range, bytearray, list, dict, tuple, int, float,
                            str, bytes, bool, collections.OrderedDict, collections.defaultdict, collections.Counter,
                            collections.deque, pathlib.PosixPath, pathlib.PurePosixPath})
_TENSOR_TYPES = (torch.Tensor, torch.UntypedStorage, torch.storage.TypedStorage, torch.device, torch.Size)
_TORCH_VALUES = (torch.dtype, torch.layout, torch.memory_format)


def _allowed(module: str, name: str, obj: Any) -> bool:
    """Whether an answer may name `obj` (module.name): data types and torch's tensor rebuilders, never a function
    that could run code of the backend's choosing here (eval, a harness entry point that imports a module...)."""
    if module.split(".")[0] == "harness":
        return (isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, (enum.Enum, BaseException)))
                or obj is _tensor_from_bytes)
    if module == "torch.multiprocessing.reductions":
        return name.startswith("rebuild_")
    if module == "copyreg":
        return name in ("_reconstructor", "__newobj__", "__newobj_ex__")
    if module == "multiprocessing.resource_sharer":
        return name == "DupFd"
    if module in ("numpy", "numpy.core.multiarray", "numpy._core.multiarray"):  # numpy's scalars and arrays
        return name in ("dtype", "ndarray", "scalar", "_reconstruct")
    if isinstance(obj, type) and issubclass(obj, _TENSOR_TYPES) or isinstance(obj, _TORCH_VALUES):
        return True
    return isinstance(obj, type) and (obj in _SAFE_BUILTINS or module == "builtins" and issubclass(obj, BaseException))


class _Answers(pickle.Unpickler):
    """Unpickles a backend process's message: it may write any bytes into its pipe, so a name it sends is looked up
    only in modules this process has already imported (never importing the plugin) and only data types pass."""

    def find_class(self, module: str, name: str) -> Any:
        if module not in sys.modules:
            raise pickle.UnpicklingError(f"the backend's process sent {module}.{name}: {module} is not imported in "
                                         "the run's process, and the run imports no backend code")
        obj = sys.modules[module]
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is None or not _allowed(module, name, obj):
            raise pickle.UnpicklingError(f"the backend's process sent {module}.{name}, which is no data type the "
                                         "run accepts from it")
        return obj


def recv_answer(conn) -> Any:
    """A message from a backend's process (a worker, a plugin's host): data only (`_Answers`)."""
    return _Answers(io.BytesIO(conn.recv_bytes())).load()


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker of a run needs: the device, plugin modules to import (None: the one that registered the
    worker's backend), CPU threads, where its output goes."""

    device: str
    modules: tuple[str, ...] | None = ()
    threads: int = 1
    log_dir: str | None = None
