"""env.json: where and with what code a run happened - the host's facts, the library versions, the checkout."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import torch

from harness.backends.registry import versioned_backends
from harness.store.host import (driver_version, gpu_uuid, hardware_fingerprint, package_version, snapshot_clocks,
                                testbed_id, tf32_settings)

REPO_ROOT = Path(__file__).resolve().parents[2]


def foreign_checkout(start: Path) -> str | None:
    """Why a run started in `start` must not go on: `start` lies in a checkout of this project whose code is not the
    `harness` this process imported (a venv installed from another checkout), so the run would time that other code
    and record its commit. None when they agree, or `start` is in no checkout."""
    for folder in (start.resolve(), *start.resolve().parents):
        if (folder / "harness" / "__init__.py").is_file() and (folder / "suites").is_dir():
            if folder == REPO_ROOT:
                return None
            return (f"this run started in the checkout {folder}, but imports harness from {REPO_ROOT}: its figures "
                    f"and commit would be the other checkout's. Run it as `python -m pytest suites` / `python -m "
                    f"harness` from {folder} (its own code first on sys.path), or with an environment installed from it")
    return None


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


def library_versions() -> dict:
    """torch, triton (torch's compiler) and the library of every registered backend (backends/registry.py), under
    env.json's names: a change in any of them is a change of the code being timed."""
    return {"torch": torch.__version__, "triton": package_version("triton") or package_version("pytorch-triton"),
            **{key: backend.installed_version() for key, backend in versioned_backends().items()}}


def environment(device: torch.device, timing_mode: str | None = None) -> dict:
    """Everything worth recording about where and with what a run happened (clocks as of now: the run start)."""
    sha, dirty = git_state()
    env = {
        **hardware_fingerprint(device),
        "testbed_id": testbed_id(device),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "timing_mode": timing_mode,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **library_versions(),
        "torch_git": getattr(torch.version, "git_version", None),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "sdpa_enabled": {kind: getattr(torch.backends.cuda, f"{kind}_sdp_enabled")()
                         for kind in ("flash", "mem_efficient", "math", "cudnn")},
        "git_sha": sha,
        "git_dirty": dirty,
        "tf32": tf32_settings(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        env.update(driver=driver_version(), gpu_uuid=gpu_uuid(device))
    env["clocks_start"] = snapshot_clocks(device)
    return env


def new_run_id() -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{socket.gethostname()[:16]}-{os.getpid()}"
