"""The wire format to the workers: torch's pickler, small CPU tensors inline, large ones in shared memory."""

from __future__ import annotations

import pickle
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
    return pickle.loads(conn.recv_bytes())


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker of a run needs: the device, plugin modules to import, CPU threads, where its output goes."""

    device: str
    modules: tuple[str, ...] = ()
    threads: int = 1
    log_dir: str | None = None
