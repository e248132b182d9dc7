"""What vLLM, SGLang and transformers would choose on their own for a workload and device, by their own rules read
from their released sources (docs/frameworks.md), and which backend here runs that choice's kernels."""

from __future__ import annotations

import importlib.util
import platform
from dataclasses import dataclass, field

import torch

from harness.backends.registry import all_backends
from harness.cases.case import AttentionCase, dtype_name

#: the releases whose rules are modelled (docs/frameworks.md: what each was read from)
VLLM_CPU_RULES = "vLLM 0.11.1-0.18.0 (vllm/platforms/cpu.py get_attn_backend_cls)"
VLLM_RULES = ("vLLM 0.13.0-0.18.0 (vllm/platforms/cuda.py _get_backend_priorities, each backend's "
              "validate_configuration)")
SGLANG_RULES = "SGLang 0.5.11-0.5.23 (arg_groups/model_override_base.py get_default_attn_backend, non-MLA models)"
TRANSFORMERS_RULES = "transformers 4.54.0-5.25.0 (modeling_utils.py _check_and_adjust_attn_implementation)"


@dataclass(frozen=True)
class Target:
    """The device a framework's rules are applied for: 'cpu' or 'cuda' with its compute capability and CUDA
    version; whether FlashInfer is installed and the CPU has AMX (SGLang asks both)."""

    kind: str
    capability: tuple[int, int] | None = None
    cuda: str | None = None
    flashinfer: bool = False
    amx: bool = False
    arm: bool = False

    @classmethod
    def of(cls, device: torch.device) -> "Target":
        """The device measured on (FlashInfer's presence by its package's spec alone: nothing is imported here)."""
        flashinfer = importlib.util.find_spec("flashinfer") is not None
        if device.type == "cuda":
            return cls("cuda", tuple(torch.cuda.get_device_capability(device)), torch.version.cuda, flashinfer)
        return cls("cpu", amx=_cpu_flag("amx_tile"), arm=platform.machine() in ("aarch64", "arm64"))

    @classmethod
    def parse(cls, text: str) -> "Target":
        """'sm90', 'sm100' or '9.0' (a CUDA GPU of that compute capability, CUDA 12.8, FlashInfer installed), 'cpu'."""
        if text == "cpu":
            return cls("cpu")
        digits = text.removeprefix("sm")
        try:
            major, minor = (int(x) for x in digits.split(".")) if "." in digits else (int(digits[:-1]), int(digits[-1]))
        except ValueError:
            raise ValueError(f"--target {text!r}: expected cpu, smXY (e.g. sm90, sm100) or X.Y (e.g. 9.0)") from None
        return cls("cuda", (major, minor), "12.8", flashinfer=True)

    def describe(self) -> str:
        if self.kind == "cpu":
            return "cpu" + (" with AMX" if self.amx else "")
        major, minor = self.capability
        return f"cuda sm{major}{minor} (CUDA {self.cuda})"


def _cpu_flag(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and flag in line.split() for line in f)
    except OSError:
        return False


@dataclass(frozen=True)
class FrameworkChoice:
    """What `framework` would set for the workload by its own rules (`rules`: the releases), which backend here runs
    those kernels (None: none does), and why; `passed_over`: the higher priorities it skipped, with why."""

    framework: str
    value: str
    backend: str | None
    why: str
    rules: str
    passed_over: tuple[str, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        runs = f" = {self.backend} here" if self.backend else " (no backend here runs its kernels)"
        skipped = f"; passed over {', '.join(self.passed_over)}" if self.passed_over else ""
        return f"{self.framework} would choose {self.value}{runs}: {self.why}{skipped} [{self.rules}]"


def backend_running(framework: str, value: str, also: tuple[str, ...] = ()) -> str | None:
    """The registered backend that declares `framework`'s setting `value` (with flags `also`), from each backend's
    own `serving` data; None when none does."""
    for name, backend in all_backends().items():
        for knob in backend.serving:
            if knob.framework == framework and knob.value == value and set(also) <= set(knob.also):
                return name
    return None


def _flash_attn_version(target: Target, case: AttentionCase) -> int:
    # vllm/v1/attention/backends/fa_utils.py get_flash_attn_version (0.17.0-0.18.0): 3 on sm90, 4 on sm10x, else
    # 2; ALiBi moves 3 and 4 down to 2
    major = target.capability[0]
    version = 3 if major == 9 else 4 if major == 10 else 2
    return 2 if case.alibi else version


def _vllm_invalid(value: str, target: Target, case: AttentionCase) -> str:
    """Why vLLM's `value` refuses the configuration ('' when valid): each backend's validate_configuration, 0.13.0."""
    dtype, head, (major, minor) = dtype_name(case.dtype), case.head_dim, target.capability
    cc = major + minor / 10
    fp8_kv, block = case.fp8_kv is not None, case.page_size
    if case.head_dim_v not in (None, case.head_dim):
        return f"head dims {head}/{case.head_dim_v} differ (vLLM serves that as MLA, not modelled here)"
    if value == "FLASH_ATTN":
        version = _flash_attn_version(target, case)
        problems = [dtype not in ("fp16", "bf16") and f"dtype {dtype}",
                    not (head % 8 == 0 and head <= 256) and f"head size {head} (needs a multiple of 8, <= 256)",
                    fp8_kv and not (version == 3 and major == 9) and "an FP8 KV cache (FA3 on sm90 only)",
                    block is not None and block % 16 and f"block size {block} (a multiple of 16)",
                    case.sinks and version < 3 and "sinks (FA3 or later)", cc < 8.0 and f"compute capability {cc}"]
    elif value == "FLASHINFER":
        problems = [dtype not in ("fp16", "bf16") and f"dtype {dtype}",
                    head not in (64, 128, 256) and f"head size {head} (64, 128 or 256)",
                    block is not None and block not in (16, 32, 64) and f"block size {block} (16, 32 or 64)",
                    not 7.5 <= cc <= 12.1 and f"compute capability {cc}",
                    case.sinks and major != 10 and "sinks (TRT-LLM kernels, sm100, only)"]
    elif value == "TRITON_ATTN":
        problems = [dtype not in ("fp16", "bf16", "fp32") and f"dtype {dtype}", head < 32 and f"head size {head}",
                    block is not None and block % 16 and f"block size {block} (a multiple of 16)"]
    else:  # FLEX_ATTENTION
        problems = [dtype not in ("fp16", "bf16", "fp32") and f"dtype {dtype}", fp8_kv and "an FP8 KV cache",
                    case.sinks and "sinks"]
    return ", ".join(p for p in problems if p)


def vllm_choice(target: Target, case: AttentionCase) -> FrameworkChoice:
    """vLLM's automatic choice: on a CPU always CPU_ATTN (vllm/platforms/cpu.py, 0.11.1 on); on CUDA the first valid
    backend of its priority list - FLASHINFER first on compute capability 10.x, FLASH_ATTN first elsewhere."""
    if target.kind == "cpu":
        return FrameworkChoice("vllm", "CPU_ATTN", None, "on a CPU vLLM always runs its own C++ kernels (any other "
                               "setting is ignored); prefill goes through torch's SDPA on x86", VLLM_CPU_RULES)
    major = target.capability[0]
    order = (["FLASHINFER", "FLASH_ATTN"] if major == 10 else ["FLASH_ATTN", "FLASHINFER"]) + ["TRITON_ATTN",
                                                                                                "FLEX_ATTENTION"]
    passed = []
    for value in order:
        invalid = _vllm_invalid(value, target, case)
        if invalid:
            passed.append(f"{value} ({invalid})")
            continue
        first = f"first valid of {', '.join(order)} on sm{major}x"
        if value == "FLASH_ATTN":
            version = _flash_attn_version(target, case)
            also = (f"--attention-config.flash_attn_version={version}",)
            return FrameworkChoice("vllm", f"FLASH_ATTN (FlashAttention-{version})",
                                   backend_running("vllm", "FLASH_ATTN", also), first, VLLM_RULES, tuple(passed))
        return FrameworkChoice("vllm", value, backend_running("vllm", value), first, VLLM_RULES, tuple(passed))
    return FrameworkChoice("vllm", "none", None, "no attention backend is valid for this configuration (vLLM "
                           "raises 'No valid attention backend found')", VLLM_RULES, tuple(passed))


def sglang_choice(target: Target, case: AttentionCase) -> FrameworkChoice:
    """SGLang's default for a non-MLA model: fa3 on Hopper with CUDA >= 12.3, trtllm_mha (fa4 where K and V head dims
    differ) on sm100 with CUDA >= 12.8, else flashinfer where it is installed and the model has no sinks, else
    triton; on a CPU intel_amx with AMX, torch_native without (or on arm64)."""
    if target.kind == "cpu":
        value = "intel_amx" if target.amx and not target.arm else "torch_native"
        why = "a CPU with AMX" if value == "intel_amx" else "a CPU without AMX: intel_amx falls back to torch_native"
        return FrameworkChoice("sglang", value, backend_running("sglang", value), why, SGLANG_RULES)
    major, cuda = target.capability[0], tuple(int(x) for x in (target.cuda or "0.0").split(".")[:2])
    if major == 9 and cuda >= (12, 3):
        value, why = "fa3", "Hopper with CUDA >= 12.3"
    elif major == 10 and cuda >= (12, 8):
        asymmetric = case.head_dim_v not in (None, case.head_dim)
        value = "fa4" if asymmetric else "trtllm_mha"
        why = "sm100 with CUDA >= 12.8" + (" and K/V head dims that differ" if asymmetric else "")
    elif target.flashinfer and not case.sinks:
        value, why = "flashinfer", "FlashInfer installed and no attention sinks"
    else:
        value = "triton"
        why = "attention sinks (FlashInfer has none)" if case.sinks else "FlashInfer not installed"
    return FrameworkChoice("sglang", value, backend_running("sglang", value), why, SGLANG_RULES)


def transformers_choice(target: Target, case: AttentionCase) -> FrameworkChoice:
    """transformers' default: sdpa where the model class supports it (assumed: every decoder transformers ships
    with SDPA support does), else eager; it never picks FlashAttention or flex by itself."""
    return FrameworkChoice("transformers", "sdpa", backend_running("transformers", "sdpa"),
                           "its default for a model class that supports SDPA (else eager)", TRANSFORMERS_RULES)


#: each framework's rules, in FRAMEWORKS' order
CHOOSERS = {"vllm": vllm_choice, "sglang": sglang_choice, "transformers": transformers_choice}
