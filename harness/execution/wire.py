"""The wire format to the workers: torch's pickler, small CPU tensors inline, a message's large ones together in
one shared-memory slab."""

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


def _plain_cpu(obj: object) -> bool:
    return isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and obj.layout == torch.strided \
        and not obj.requires_grad


class _Pickler(ForkingPickler):
    """torch's multiprocessing pickler, with small CPU tensors copied into the message and the large ones set aside
    (`large`), to travel in one shared-memory slab a message (_dumps)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.large: list[torch.Tensor] = []

    def persistent_id(self, obj):
        if _plain_cpu(obj) and obj.nbytes > INLINE_BYTES:
            self.large.append(obj)
            return len(self.large) - 1
        return None

    def reducer_override(self, obj):
        if _plain_cpu(obj) and obj.nbytes <= INLINE_BYTES:
            data = obj.detach().contiguous().view(torch.uint8).numpy().tobytes() if obj.numel() else b""
            return _tensor_from_bytes, (obj.dtype, tuple(obj.shape), data)
        return NotImplemented


def _dumps(obj: Any) -> bytes:
    """The message: (obj pickled, the slab of its large tensors or None, each one's (dtype, shape, offset)). One
    segment a message, not one a tensor: a round's judged answers are up to 20 tensors of 0.1-2 MB, and each segment
    costs a trip to the sender's fd sharer."""
    buffer = io.BytesIO()
    pickler = _Pickler(buffer, pickle.HIGHEST_PROTOCOL)
    pickler.dump(obj)
    layout, end = [], 0
    for t in pickler.large:
        start = -(-end // 16) * 16  # aligned for every dtype
        layout.append((t.dtype, tuple(t.shape), start))
        end = start + t.nbytes
    slab = torch.empty(end, dtype=torch.uint8) if layout else None
    for t, (_, _, start) in zip(pickler.large, layout):
        slab[start:start + t.nbytes].copy_(t.detach().contiguous().view(-1).view(torch.uint8))
    return bytes(ForkingPickler.dumps((buffer.getvalue(), slab, tuple(layout))))


class _Slab:
    """Resolves a message's large tensors in its slab (_dumps), each checked to lie within it."""

    def __init__(self, slab: torch.Tensor | None, layout: tuple):
        self.slab, self.layout = slab, layout

    def persistent_load(self, pid: Any) -> torch.Tensor:
        try:
            dtype, shape, start = self.layout[pid]
            size = torch.Size(shape).numel() * dtype.itemsize
            if not (isinstance(dtype, torch.dtype) and isinstance(start, int) and 0 <= start
                    and start + size <= self.slab.numel() and self.slab.dtype == torch.uint8):
                raise ValueError
            return self.slab[start:start + size].view(dtype).view(shape)
        except Exception as exc:  # noqa: BLE001 - whatever the sender wrote, it is refused in one line
            raise pickle.UnpicklingError(f"the message's tensor {pid!r} does not lie within its slab") from exc


def send(conn, obj: Any) -> None:
    conn.send_bytes(_dumps(obj))


def recv(conn) -> Any:
    """A message from the run's process (trusted: the worker's side of the pipe)."""
    data, slab, layout = pickle.loads(conn.recv_bytes())
    loader = pickle.Unpickler(io.BytesIO(data))
    loader.persistent_load = _Slab(slab, layout).persistent_load
    return loader.load()


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
    """A message from a backend's process (a worker, a plugin's host): data only (`_Answers`), its large tensors
    looked up in its slab."""
    message = _Answers(io.BytesIO(conn.recv_bytes())).load()
    if not (isinstance(message, tuple) and len(message) == 3 and isinstance(message[0], bytes)
            and (message[1] is None or isinstance(message[1], torch.Tensor)) and isinstance(message[2], tuple)):
        raise pickle.UnpicklingError("the backend's process sent a message that is not (data, slab, layout)")
    loader = _Answers(io.BytesIO(message[0]))
    loader.persistent_load = _Slab(message[1], message[2]).persistent_load
    return loader.load()


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker of a run needs: the device, plugin modules to import (None: the one that registered the
    worker's backend), CPU threads, where its output goes."""

    device: str
    modules: tuple[str, ...] | None = ()
    threads: int = 1
    log_dir: str | None = None
