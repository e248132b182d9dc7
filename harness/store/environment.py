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

REPO_ROOT = Path(__file__).resolve().parents[2]


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
            "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
            "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32)}
    if device.type == "cpu":
        # CPU kernels scale with the thread count; GPU kernels do not, so a multi-GPU launcher that splits the
        # host's threads between its processes still compares with a single-GPU run.
        info["threads"] = torch.get_num_threads()
    else:
        props = torch.cuda.get_device_properties(device)
        info.update(compute_capability=f"{props.major}.{props.minor}", sm_count=props.multi_processor_count,
                    memory_bytes=props.total_memory)
    return info


def testbed_id(device: torch.device) -> str:
    blob = json.dumps(hardware_fingerprint(device), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


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
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        env["driver"] = _nvidia_smi("driver_version") or _nvml_driver()
        env["gpu_uuid"] = _gpu_uuid(device)
    env["clocks_start"] = snapshot_clocks(device)
    return env


def _nvidia_smi(field: str, gpu: str | None = None) -> str | None:
    """One field of `nvidia-smi --query-gpu` for `gpu` (index or UUID; first GPU when None), or None."""
    try:
        cmd = ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits"] + (["-i", gpu] if gpu else [])
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout
        return out.strip().splitlines()[0]
    except Exception:
        return None


def _gpu_uuid(device: torch.device) -> str | None:
    """'GPU-…' UUID of a torch device: NVML and nvidia-smi number GPUs physically, torch after
    CUDA_VISIBLE_DEVICES, so the UUID is the only name both agree on."""
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    except Exception:
        return None
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def _nvml_driver() -> str | None:
    try:
        import pynvml  # nvidia-ml-py; optional
        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        return driver.decode() if isinstance(driver, bytes) else driver
    except Exception:
        return None


#: nvidia-smi --query-gpu fields of a clock snapshot, keyed by the name they get in env.json
_SMI_FIELDS = {"sm_clock_mhz": "clocks.sm", "mem_clock_mhz": "clocks.mem", "max_sm_clock_mhz": "clocks.max.sm",
               "power_w": "power.draw", "power_limit_w": "power.limit", "temperature_c": "temperature.gpu",
               "pstate": "pstate", "throttle_reasons": "clocks_throttle_reasons.active"}


def snapshot_clocks(device: torch.device) -> dict:
    """Clocks, power, temperature and throttle state of `device` now, to record at run start and end.

    A run whose clocks dropped or that throttled between the two snapshots timed a slower machine than its
    testbed id says. Sources, best first: NVML (pynvml / nvidia-ml-py), nvidia-smi, else
    {"source": "unavailable", "reason": ...}. On CPU: current core frequencies and load average, because on a
    shared host other load is what makes two runs differ.
    """
    taken = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if device.type == "cpu":
        return {"source": "cpu", "taken": taken, **_cpu_clocks()}
    uuid = _gpu_uuid(device)
    try:
        return {"source": "nvml", "taken": taken, **_nvml_clocks(uuid, device.index or 0)}
    except Exception as nvml_exc:  # not installed, no driver, or an old NVML without some query
        nvml_reason = f"nvml: {type(nvml_exc).__name__}: {nvml_exc}"
    values = {key: _nvidia_smi(field, uuid) for key, field in _SMI_FIELDS.items()}
    if any(v is not None for v in values.values()):
        return {"source": "nvidia-smi", "taken": taken, **values}
    return {"source": "unavailable", "taken": taken, "reason": f"{nvml_reason}; nvidia-smi: no answer"}


def _nvml_clocks(uuid: str | None, index: int) -> dict:
    import pynvml  # nvidia-ml-py; optional

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else pynvml.nvmlDeviceGetHandleByIndex(index)
    get_reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons  # renamed in newer NVML
    return {"sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,  # NVML reports milliwatts
            "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
            "temperature_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            "pstate": f"P{pynvml.nvmlDeviceGetPerformanceState(handle)}",
            "throttle_reasons": hex(get_reasons(handle))}


def _cpu_clocks() -> dict:
    mhz = []
    try:
        mhz = [float(line.split(":", 1)[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
               if line.startswith("cpu MHz")]
    except (OSError, ValueError):
        pass
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {"cpu_mhz": mhz or None, "loadavg": load}


def available_memory() -> int:
    """Bytes of host memory available now (MemAvailable), or 8 GiB where /proc/meminfo cannot tell."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 8 * 2 ** 30


def new_run_id() -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{socket.gethostname()[:16]}-{os.getpid()}"
