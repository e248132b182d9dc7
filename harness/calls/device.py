"""Which device a run uses: a user's name for it, resolved and checked once."""

from __future__ import annotations

import torch


def resolve_device(name: str | None) -> torch.device:
    """'cuda', 'cuda:1', 'cpu' or None (= cuda when present, else cpu); a bad name is a ValueError."""
    if name in (None, "", "auto"):
        return indexed(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {name!r} is not a device name; allowed: auto, cpu, cuda, cuda:N") from exc
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name!r}: allowed: auto, cpu, cuda, cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: no CUDA device visible to torch {torch.__version__}")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: torch sees {torch.cuda.device_count()} CUDA device(s), "
                         f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return indexed(device)


def indexed(device: torch.device) -> torch.device:
    """'cuda' -> 'cuda:<current>': rows name the device that ran, and torch.cuda.set_device rejects a bare 'cuda'."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device

