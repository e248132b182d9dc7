"""Where the float64 reference is kept and the verdicts computed: on the run's device when it fits, else the host."""

from __future__ import annotations

import torch

#: a GPU run keeps a case's float64 reference on the device (every verdict of the case computed there) when the
#: reference takes at most this share of the device's free memory; a larger one goes to the host, judged there
DEVICE_SHARE = 1 / 4
#: the rule as env.json records it (judging)
RULE = (f"verdicts computed where the float64 reference is kept: on a GPU run the device, when the reference takes "
        f"at most {DEVICE_SHARE:g} of its free memory, else the host; a CPU run the CPU")


def judging_device(device: torch.device, reference_bytes: int, free_bytes: int | None = None) -> torch.device:
    """Where a reference of `reference_bytes` made on `device` is kept and its answers judged (RULE); `free_bytes`:
    the device's free memory (default: torch.cuda.mem_get_info's)."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.device("cpu")
    free = torch.cuda.mem_get_info(device)[0] if free_bytes is None else free_bytes
    return device if reference_bytes <= free * DEVICE_SHARE else torch.device("cpu")


def reference_bytes(tensors) -> int:
    """Bytes of the tensors given (None skipped): a Reference's, or one slice's."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)
