"""The wire format to the workers: torch's pickler, small CPU tensors inline, the large ones in a shared-memory arena
each end keeps, a GPU's by CUDA IPC handle, checked and copied on the device by the reader (Channel)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import io
import multiprocessing
import pathlib
import pickle
import sys
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable

import torch
import torch.multiprocessing  # noqa: F401 - registers tensor reductions: large CPU tensors travel in shared memory

from harness.measure.stages import stage

#: tensors up to this size travel inline, the larger ones in the sender's arena (Channel): a round's five answers of
#: 4 x 4 KiB crossed in 0.43 ms inline against 0.46 ms, 16 KiB 0.59 against 0.48, 32 KiB 2.5 against 0.59, 256 KiB 21
#: against 4.4 (benchmarks/worker_transfer.py, docs/measurements.md: inline, a message over the pipe's 64 KiB buffer
#: crosses in turns of the two processes)
INLINE_BYTES = 4 * 2 ** 10


def _tensor_from_bytes(dtype: torch.dtype, shape: tuple[int, ...], data: bytes) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


def _plain_cpu(obj: object) -> bool:
    return isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and obj.layout == torch.strided \
        and not obj.requires_grad


def _plain_cuda(obj: object) -> bool:
    return isinstance(obj, torch.Tensor) and obj.device.type == "cuda" and obj.layout == torch.strided \
        and not obj.requires_grad


#: a CUDA tensor as it crosses (torch's reduce_tensor's arguments for rebuild_cuda_tensor, as plain data): its view,
#: and the IPC handles of its allocation, its producer's reference counter and the event its data is ready after
HANDLE_FIELDS = ("size", "stride", "offset", "dtype", "device", "handle", "storage_bytes", "storage_offset_bytes",
                 "ref_counter_handle", "ref_counter_offset", "event_handle", "event_sync_required")


def cuda_handle(t: torch.Tensor) -> tuple:
    """`t`'s HANDLE_FIELDS through torch's own reduction (torch.multiprocessing.reductions.reduce_tensor): the
    allocation stays alive in this process until the reader releases it (torch's IPC reference counter)."""
    from torch.multiprocessing.reductions import reduce_tensor
    _, args = reduce_tensor(t.detach())
    (_, size, stride, offset, _, dtype, device, handle, storage_bytes, storage_offset_bytes, _, counter,
     counter_offset, event, sync) = args
    return (tuple(size), tuple(stride), offset, dtype, device, handle, storage_bytes, storage_offset_bytes, counter,
            counter_offset, event, sync)


def _int(x: object, least: int = 0) -> bool:
    return type(x) is int and x >= least


def handle_problem(fields: object, device_count: int) -> str:
    """'' when `fields` (HANDLE_FIELDS) are well formed: plain values, a device this process has, a view that lies
    within the allocation's stated size; else what is wrong, in a few words."""
    if not (isinstance(fields, tuple) and len(fields) == len(HANDLE_FIELDS)):
        return f"not the {len(HANDLE_FIELDS)} fields of a handle"
    f = dict(zip(HANDLE_FIELDS, fields))
    size, stride = f["size"], f["stride"]
    if not (isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride)
            and all(_int(n) for n in size) and all(_int(n) for n in stride) and _int(f["offset"])):
        return f"size {size!r}, stride {stride!r}, offset {f['offset']!r} are no tensor view"
    if not isinstance(f["dtype"], torch.dtype):
        return f"dtype {f['dtype']!r} is no torch dtype"
    if not (_int(f["device"]) and f["device"] < device_count):
        return f"device {f['device']!r} is no CUDA device of this process ({device_count})"
    if not (isinstance(f["handle"], bytes) and f["handle"] and isinstance(f["ref_counter_handle"], bytes)
            and (f["event_handle"] is None or isinstance(f["event_handle"], bytes))
            and type(f["event_sync_required"]) is bool):
        return "its handles are not bytes"
    if not (_int(f["storage_bytes"], 1) and _int(f["storage_offset_bytes"]) and _int(f["ref_counter_offset"])):
        return f"storage of {f['storage_bytes']!r} bytes at {f['storage_offset_bytes']!r} is no allocation"
    elements = f["storage_bytes"] // f["dtype"].itemsize
    extent = f["offset"] + sum((n - 1) * s for n, s in zip(size, stride)) + 1 if all(size) else 0
    if extent > elements:
        return f"its view reaches element {extent} of a storage of {elements}"
    return ""


def open_handle(fields: tuple) -> torch.Tensor:
    """The tensor well-formed `fields` name, opened by torch's own rebuild (rebuild_cuda_tensor; the classes are this
    function's, never the sender's), checked to be a CUDA allocation of the stated size."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor
    f = dict(zip(HANDLE_FIELDS, fields))
    t = rebuild_cuda_tensor(torch.Tensor, torch.Size(f["size"]), f["stride"], f["offset"], torch.storage.TypedStorage,
                            f["dtype"], f["device"], f["handle"], f["storage_bytes"], f["storage_offset_bytes"], False,
                            f["ref_counter_handle"], f["ref_counter_offset"], f["event_handle"],
                            f["event_sync_required"])
    if not (type(t) is torch.Tensor and t.is_cuda and t.untyped_storage().nbytes() == f["storage_bytes"]):
        raise ValueError(f"opened as {type(t).__name__} on {t.device}, {t.untyped_storage().nbytes()} bytes")
    return t


class _Handles:
    """Resolves a message's CUDA tensors (HANDLE_FIELDS each): checked, opened, copied on the device at once (the
    sender may write its allocation again), and released together once every copy is done (release)."""

    def __init__(self, handles: tuple, opener: Callable[[tuple], torch.Tensor] = open_handle,
                 device_count: Callable[[], int] = torch.cuda.device_count):
        self.handles, self.opener, self.device_count = handles, opener, device_count
        self.opened: list[torch.Tensor] = []

    def load(self, index: int) -> torch.Tensor:
        fields = self.handles[index] if _int(index) and index < len(self.handles) else None
        if problem := handle_problem(fields, self.device_count()):
            raise pickle.UnpicklingError(f"the backend's process sent a CUDA handle that names no CUDA allocation "
                                         f"of the size it states ({problem}): refused")
        try:
            shared = self.opener(fields)
        except Exception as exc:  # noqa: BLE001 - torch's own error, on the run's side of the line
            raise pickle.UnpicklingError(f"the backend's process sent a CUDA handle that names no CUDA allocation "
                                         f"of the size it states ({type(exc).__name__}: "
                                         f"{str(exc).splitlines()[0] if str(exc) else ''}): refused") from exc
        self.opened.append(shared)
        with torch.cuda.device(shared.device) if shared.is_cuda else contextlib.nullcontext():
            return shared.clone()

    def empty(self, dtype: object, shape: object, device: object) -> torch.Tensor:
        """An empty CUDA tensor the sender named (no allocation to open), made here once its fields are checked."""
        if not (isinstance(dtype, torch.dtype) and isinstance(shape, tuple) and all(_int(n) for n in shape)
                and 0 in shape and _int(device) and device < self.device_count()):
            raise pickle.UnpicklingError(f"the backend's process sent an empty CUDA tensor of dtype {dtype!r}, shape "
                                         f"{shape!r} on device {device!r}, which is none this process has: refused")
        return torch.empty(shape, dtype=dtype, device=torch.device("cuda", device))

    def release(self) -> None:
        """Wait for the copies, then let the sender's allocations go (torch's counter, as the opened tensors die)."""
        for device in {t.device for t in self.opened if t.is_cuda}:
            torch.cuda.current_stream(device).synchronize()
        self.opened.clear()


class _Pickler(ForkingPickler):
    """torch's multiprocessing pickler, with small CPU tensors copied into the message and the large ones set aside
    (`large`), to travel in the sending end's arena (Channel)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.large: list[torch.Tensor] = []
        self.cuda: list[torch.Tensor] = []

    def persistent_id(self, obj):
        if _plain_cpu(obj) and obj.nbytes > INLINE_BYTES:
            self.large.append(obj)
            return len(self.large) - 1
        if _plain_cuda(obj) and obj.numel() == 0:  # no allocation to name: made anew by the reader
            return ("empty", obj.dtype, tuple(obj.shape), obj.device.index)
        if _plain_cuda(obj):  # by IPC handle, never through the host (_Handles)
            self.cuda.append(obj)
            return ("cuda", len(self.cuda) - 1)
        return None

    def reducer_override(self, obj):
        if _plain_cpu(obj) and obj.nbytes <= INLINE_BYTES:
            data = obj.detach().contiguous().view(torch.uint8).numpy().tobytes() if obj.numel() else b""
            return _tensor_from_bytes, (obj.dtype, tuple(obj.shape), data)
        return NotImplemented


class _Arena:
    """Resolves a message's large tensors in the arena they came in (Channel), each checked to lie within it, and
    copied out: the other end may write its arena again once this one is read; its CUDA tensors by handle."""

    def __init__(self, arena: torch.Tensor | None, layout: tuple, handles: _Handles):
        self.arena, self.layout, self.handles = arena, layout, handles

    def persistent_load(self, pid: Any) -> torch.Tensor:
        if isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "cuda":
            return self.handles.load(pid[1])
        if isinstance(pid, tuple) and len(pid) == 4 and pid[0] == "empty":
            return self.handles.empty(*pid[1:])
        try:
            dtype, shape, start = self.layout[pid]
            size = torch.Size(shape).numel() * dtype.itemsize
            if not (isinstance(dtype, torch.dtype) and isinstance(start, int) and 0 <= start
                    and start + size <= self.arena.numel() and self.arena.dtype == torch.uint8):
                raise ValueError
            # numpy's copy: one thread, as torch's would wake the process's OpenMP threads, which then spin beside the
            # worker on the same cores (the main job's worker pipe 12.1-12.9 s with torch's, against 10.3-11.0 before)
            return torch.from_numpy(self.arena[start:start + size].numpy().copy()).view(dtype).view(shape)
        except Exception as exc:  # noqa: BLE001 - whatever the sender wrote, it is refused in one line
            raise pickle.UnpicklingError(f"the message's tensor {pid!r} does not lie within its arena") from exc


#: what a backend's process may make this one build, besides harness's data classes and torch's tensors: values
_SAFE_BUILTINS = frozenset({object, set, frozenset, slice, complex, range, bytearray, list, dict, tuple, int, float,
                            str, bytes, bool, collections.OrderedDict, collections.defaultdict, collections.Counter,
                            collections.deque, pathlib.PosixPath, pathlib.PurePosixPath})
_TENSOR_TYPES = (torch.Tensor, torch.UntypedStorage, torch.storage.TypedStorage, torch.device, torch.Size)
_TORCH_VALUES = (torch.dtype, torch.layout, torch.memory_format)
#: torch's rebuilders of CPU tensors in shared memory (the arena): never rebuild_cuda_tensor or rebuild_event, which
#: would open whatever handle the sender names (_Handles checks one first)
_CPU_REBUILDS = frozenset({"rebuild_tensor", "rebuild_storage_fd", "rebuild_storage_filename", "rebuild_storage_empty",
                           "rebuild_typed_storage", "rebuild_typed_storage_child"})


def _allowed(module: str, name: str, obj: Any) -> bool:
    """Whether an answer may name `obj` (module.name): data types and torch's tensor rebuilders, never a function
    that could run code of the backend's choosing here (eval, a harness entry point that imports a module...)."""
    if module.split(".")[0] == "harness":
        return (isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, (enum.Enum, BaseException)))
                or obj is _tensor_from_bytes)
    if module == "torch.multiprocessing.reductions":  # a CPU tensor's; a CUDA one crosses by checked handle alone
        return name in _CPU_REBUILDS
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


#: an end's arena is kept for its next messages up to this size (bytes), a larger message's made for it alone: a kept
#: arena stays in shared memory (/dev/shm) as long as its worker, and the CPU main job's largest round needs ~40 MiB
ARENA_KEPT_BYTES = 64 * 2 ** 20
#: an arena is a whole number of these (bytes): the fewest that hold the message that makes it
ARENA_STEP_BYTES = 2 ** 20


class Channel:
    """One end of a pipe between the run's process and a backend's: a message's small tensors inline, its large ones in
    this end's arena - one shared-memory segment kept across messages (made anew, larger, when one does not fit), sent
    to the other end once, as it is made (a segment a message cost a trip to the sender's fd sharer and fresh pages on
    both ends: benchmarks/worker_transfer.py). The reader copies each tensor out as it reads (_Arena), so nothing it
    keeps can be written by the other end later; an end writes its arena only to send, and each sends only after reading
    the other's last message (a request, then its reply), so no message is overwritten unread. from_backend: what
    arrives is a backend process's (_Answers)."""

    def __init__(self, conn, *, from_backend: bool):
        self.conn, self.from_backend = conn, from_backend
        self._arena: torch.Tensor | None = None  # this end's, written to send
        self._peer: torch.Tensor | None = None  # the other end's, read

    def send(self, obj: Any) -> None:
        """`obj` pickled, its large tensors copied into this end's arena (made anew, larger, when they do not fit)."""
        buffer = io.BytesIO()
        pickler = _Pickler(buffer, pickle.HIGHEST_PROTOCOL)
        pickler.dump(obj)
        layout, end = [], 0
        for t in pickler.large:
            start = -(-end // 16) * 16  # aligned for every dtype
            layout.append((t.dtype, tuple(t.shape), start))
            end = start + t.nbytes
        arena, made = self._arena, None
        if layout and (arena is None or arena.numel() < end):
            size = -(-end // ARENA_STEP_BYTES) * ARENA_STEP_BYTES
            arena = made = torch.empty(size, dtype=torch.uint8).share_memory_()
            if size <= ARENA_KEPT_BYTES:
                self._arena = made
        into = None if arena is None else arena.numpy()
        for t, (_, _, start) in zip(pickler.large, layout):  # numpy's copy: one thread (_Arena)
            into[start:start + t.nbytes] = t.detach().contiguous().view(-1).view(torch.uint8).numpy()
        handles = tuple(cuda_handle(t) for t in pickler.cuda)
        self.conn.send_bytes(bytes(ForkingPickler.dumps((buffer.getvalue(), made, tuple(layout), handles))))

    def recv(self) -> Any:
        """The other end's next message, its large tensors copied out of the arena they came in."""
        raw = self.conn.recv_bytes()
        message = _Answers(io.BytesIO(raw)).load() if self.from_backend else pickle.loads(raw)
        if not (isinstance(message, tuple) and len(message) == 4 and isinstance(message[0], bytes)
                and (message[1] is None or isinstance(message[1], torch.Tensor)) and isinstance(message[2], tuple)
                and isinstance(message[3], tuple)):
            sender = "the backend's process" if self.from_backend else "the run's process"
            raise pickle.UnpicklingError(f"{sender} sent a message that is not (data, arena, layout, handles)")
        data, made, layout, handles = message
        if made is not None and made.numel() <= ARENA_KEPT_BYTES:
            self._peer = made
        loader = _Answers(io.BytesIO(data)) if self.from_backend else pickle.Unpickler(io.BytesIO(data))
        opened = _Handles(handles)
        loader.persistent_load = _Arena(self._peer if made is None else made, layout, opened).persistent_load
        try:
            with stage("answers across (CUDA IPC)") if handles else contextlib.nullcontext():
                return loader.load()
        finally:
            opened.release()


#: what the forkserver imports once, so that every worker forked from it starts with it
FORKSERVER_PRELOAD = ("harness.isolation.worker",)


def worker_context():
    """The multiprocessing context every worker and plugin process starts from: forkserver, with FORKSERVER_PRELOAD
    imported once."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return ctx


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker of a run needs: the device, plugin modules to import (None: the one that registered the
    worker's backend), CPU threads, where its output goes."""

    device: str
    modules: tuple[str, ...] | None = ()
    threads: int = 1
    log_dir: str | None = None
