"""The machine a run happens on: device and CPU names, TF32 settings, the testbed id, GPU UUIDs, clocks, memory."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
from datetime import datetime, timezone
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch


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
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()


def package_version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _setting(read) -> object:
    try:
        return read()
    except Exception as exc:  # e.g. a legacy TF32 getter after the new fp32_precision API was used
        return f"unreadable ({type(exc).__name__})"


def tf32_settings() -> dict:
    """Whether fp32 matmuls and convolutions may use TF32, as torch reports it (the fp32_precision API where this
    torch has it; reading the legacy flags raises once it was used; its "none" defers to them) and the environment
    overrides underneath: NVIDIA_TF32_OVERRIDE (cuBLAS/cuDNN) and TORCH_ALLOW_TF32_CUBLAS_OVERRIDE (torch, at start)."""
    flags = {"matmul": torch.backends.cuda.matmul, "cudnn": torch.backends.cudnn}
    new_api = hasattr(flags["matmul"], "fp32_precision")
    settings = {}
    for key, f in flags.items():  # the legacy flag decides where the new API says "none" or this torch has none
        precision = _setting(lambda: f.fp32_precision) if new_api else None
        settings[key] = precision if precision not in (None, "none") else _setting(lambda: bool(f.allow_tf32))
    if new_api:
        settings["default"] = _setting(lambda: torch.backends.fp32_precision)
    settings["float32_matmul_precision"] = _setting(torch.get_float32_matmul_precision)
    return settings | {var: os.environ.get(var) for var in ("NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")}


def hardware_fingerprint(device: torch.device) -> dict:
    """Fields that define a testbed: hardware and settings, deliberately not software versions."""
    tf32 = tf32_settings()
    info = {"device_type": device.type, "device_name": device_name(device), "cpu_model": cpu_model(),
            "tf32_matmul": tf32["matmul"], "tf32_cudnn": tf32["cudnn"]}
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
    return hashlib.sha256(json.dumps(hardware_fingerprint(device), sort_keys=True).encode()).hexdigest()[:12]


def _smi_lines(*args: str) -> list[str]:
    """The output lines of `nvidia-smi <args>` ([] when it fails or is absent)."""
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip().splitlines()
    except Exception:
        return []


def _nvidia_smi(field: str, gpu: str | None = None) -> str | None:
    """One field of `nvidia-smi --query-gpu` for `gpu` (index or UUID; first GPU when None), or None."""
    lines = _smi_lines(f"--query-gpu={field}", "--format=csv,noheader,nounits", *(["-i", gpu] if gpu else []))
    return lines[0] if lines else None


#: one line of `nvidia-smi -L`: a GPU ("GPU 0: NVIDIA H100 ... (UUID: GPU-...)") or a MIG instance under it
#: ("  MIG 3g.40gb Device 0: (UUID: MIG-...)")
_SMI_DEVICE = re.compile(r"^\s*(GPU \d+|MIG [^:]*?Device\s+\d+):.*\(UUID: ((?:GPU|MIG)-[0-9a-fA-F-]+)\)")


def smi_devices(listing: str | None = None) -> list[tuple[str, str]]:
    """[(label, UUID)] of every GPU and MIG instance `nvidia-smi -L` lists (its output may be given)."""
    lines = _smi_lines("-L") if listing is None else listing.splitlines()
    return [(m[1], m[2]) for m in map(_SMI_DEVICE.match, lines) if m]


def gpu_uuid(device: torch.device, listing: str | None = None) -> str | None:
    """The NVML/nvidia-smi name ('GPU-…' or, under MIG, 'MIG-…') of a torch device: NVML and nvidia-smi number
    GPUs physically, torch after CUDA_VISIBLE_DEVICES, so the UUID is the only name both agree on. torch gives
    it without its prefix; the prefix is the one nvidia-smi lists for that UUID (a MIG instance is no 'GPU-')."""
    try:
        raw = str(torch.cuda.get_device_properties(device).uuid)
    except Exception:
        return None
    if raw.startswith(("GPU-", "MIG-")):
        return raw
    return next((uuid for _, uuid in smi_devices(listing) if uuid.split("-", 1)[1] == raw), f"GPU-{raw}")


#: nvidia-smi --query-gpu fields of a clock snapshot, keyed by the name they get in env.json
_SMI_FIELDS = {"sm_clock_mhz": "clocks.sm", "mem_clock_mhz": "clocks.mem", "max_sm_clock_mhz": "clocks.max.sm",
               "power_w": "power.draw", "power_limit_w": "power.limit", "temperature_c": "temperature.gpu",
               "pstate": "pstate", "throttle_reasons": "clocks_throttle_reasons.active"}


def snapshot_clocks(device: torch.device) -> dict:
    """Clocks, power, temperature and throttle state of `device` now, to record at run start and end. Sources,
    best first: NVML (pynvml), nvidia-smi, else {"source": "unavailable", "reason": ...}; on CPU: core frequencies
    and the load average (on a shared host, other load is what makes two runs differ)."""
    taken = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if device.type == "cpu":
        return {"source": "cpu", "taken": taken, **_cpu_clocks()}
    uuid = gpu_uuid(device)
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
    try:
        mhz = [float(line.split(":", 1)[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
               if line.startswith("cpu MHz")]
    except (OSError, ValueError):
        mhz = []
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


def driver_version() -> str | None:
    """The NVIDIA driver's version (nvidia-smi, else NVML), or None."""
    if driver := _nvidia_smi("driver_version"):
        return driver
    try:
        import pynvml  # nvidia-ml-py; optional
        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        return driver.decode() if isinstance(driver, bytes) else driver
    except Exception:
        return None
