"""Where a run happened: device, software versions, settings, and a testbed id for comparing like with like."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
from datetime import datetime, timezone
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent


def resolve_device(name: str | None) -> torch.device:
    """'cuda', 'cuda:1', 'cpu' or None (= cuda when present, else cpu); a bad name is a ValueError."""
    if name in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {name!r} is not a device name; allowed: auto, cpu, cuda, cuda:N") from exc
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name!r}: allowed: auto, cpu, cuda, cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: no CUDA device visible to torch {torch.__version__}")
    return device


@lru_cache(maxsize=None)
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


@lru_cache(maxsize=None)
def git_state() -> tuple[str, bool]:
    """(HEAD sha, dirty) of the project checkout; ('unknown', False) outside git."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    try:
        return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))
    except Exception:
        return "unknown", False


def package_version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def hardware_fingerprint(device: torch.device) -> dict:
    """Fields that define a testbed: hardware and settings, deliberately not software versions."""
    info = {"device_type": device.type, "device_name": device_name(device), "cpu_model": cpu_model(),
            "threads": torch.get_num_threads(),
            "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
            "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(compute_capability=f"{props.major}.{props.minor}", sm_count=props.multi_processor_count,
                    memory_bytes=props.total_memory)
    return info


def testbed_id(device: torch.device) -> str:
    blob = json.dumps(hardware_fingerprint(device), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def environment(device: torch.device) -> dict:
    """Everything worth recording about where and with what a run happened."""
    sha, dirty = git_state()
    env = {
        **hardware_fingerprint(device),
        "testbed_id": testbed_id(device),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": package_version("triton") or package_version("pytorch-triton"),
        "xformers": package_version("xformers"),
        "flash_attn": package_version("flash-attn"),
        "sdpa_enabled": {"flash": torch.backends.cuda.flash_sdp_enabled(),
                         "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                         "math": torch.backends.cuda.math_sdp_enabled(),
                         "cudnn": torch.backends.cuda.cudnn_sdp_enabled()},
        "git_sha": sha,
        "git_dirty": dirty,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        env["driver"] = _nvidia_smi("driver_version")
    return env


def _nvidia_smi(field: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10, check=True).stdout
        return out.strip().splitlines()[0]
    except Exception:
        return None


def new_run_id() -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{socket.gethostname()[:16]}-{os.getpid()}"
