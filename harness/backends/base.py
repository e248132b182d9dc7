"""The Backend contract: capabilities as data, a `Plan` prepared once per case naming its kernels, one call."""

from __future__ import annotations

import importlib
import inspect

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import torch

from harness.cases.case import AttentionCase, dtype_name
from harness.cases.masks import CacheCausal, MaskSpec
from harness.cases.modifiers import MODIFIERS

if TYPE_CHECKING:
    from harness.backends.install import Install
    from harness.backends.serving import ServingKnob

LAYOUTS = ("bhsd", "bshd")
#: the library calls a backend may offer beyond `forward`, for probes of the library's own conventions
NATIVE_PROBES = ("causal", "mask", "dropout")
#: the probes whose cases a backend may declare a known failure of (harness/probes/empty.py, edge_cases.py)
FAILURE_PROBES = ("empty", "edge")


@dataclass(frozen=True)
class KnownFailure:
    """A documented limitation of a backend: probe `probe`'s case `case` (an empty shape, an edge case's name) fails,
    on `device` ('cpu', 'cuda'; None = every device), for `why`; the suite expects it to fail (strict xfail)."""

    probe: str
    case: str
    why: str
    device: str | None = None

    def __post_init__(self):
        if self.probe not in FAILURE_PROBES:
            raise ValueError(f"KnownFailure.probe={self.probe!r}; allowed: {', '.join(FAILURE_PROBES)}")
        if not self.case or not self.why:
            raise ValueError(f"KnownFailure({self.probe!r}, {self.case!r}): needs the case's name and why it fails")


class Unsupported(Exception):
    """Raised by a backend during a call when it discovers it cannot run a case; becomes 'unsupported'."""


class BackwardUnsupported(Unsupported):
    """No backward for the case (raised when called with gradients): the forward is judged alone."""


@dataclass(kw_only=True)
class Plan:
    """What `prepare` builds once per case and hands `forward` as `prepared=`, naming the kernels the row records."""

    #: the forward's kernel, e.g. 'sdpa:flash' (the backend's name where it cannot tell)
    op: str
    #: the backward's kernel where it differs from the forward's ('' = the same)
    backward_op: str = ""

    def ops(self, training: bool) -> tuple[str, str]:
        """(forward, backward) kernels of a call with gradients (`training`) or without."""
        return self.op, self.backward_op or self.op


@dataclass
class CallPlan(Plan):
    """A plan that is the call's arguments on the device (its keywords, for most); `paged`: a call with a page table."""

    kwargs: dict
    paged: bool = False


class ProbeHooks:
    """The library's own calls (no mask spec) for the semantics and dropout probes, in the backend's layout."""

    name: ClassVar[str] = ""
    #: the library calls offered (subset of NATIVE_PROBES): native_causal, native_mask, native_dropout
    native_probes: ClassVar[frozenset[str]] = frozenset()

    def native_causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float) -> torch.Tensor:
        """The library's own causal switch (no mask spec)."""
        raise NotImplementedError(f"{self.name} declares no native causal probe")

    def native_mask(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor,
                    scale: float) -> torch.Tensor:
        """A dense (B|1, H|1, Sq, Sk) mask tensor, bool (True = attend) or additive, in the library's own form."""
        raise NotImplementedError(f"{self.name} declares no native mask probe")

    def native_dropout(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, p: float,
                       scale: float) -> torch.Tensor:
        """The library's own dropout at probability p."""
        raise NotImplementedError(f"{self.name} declares no native dropout probe")


class DescriptionHooks:
    """What rows, `python -m harness backends` and the advisor read about a backend besides its results."""

    name: ClassVar[str] = ""
    #: the distribution whose version its rows record and env.json keeps (None = torch's, which env.json keeps anyway)
    package: ClassVar[str | None] = None
    #: env.json's name for that version (None = the package's name with '_' for '-', e.g. flash_attn)
    version_name: ClassVar[str | None] = None
    #: how the report and the figures' legends name it ('' = its name)
    label: ClassVar[str] = ""
    #: its colour and marker in every figure (None = picked from a stable hash of its name)
    colour: ClassVar[str | None] = None
    marker: ClassVar[str | None] = None
    #: the library it calls as README's first paragraph, pyproject's description and --help name it ('' = its label)
    library: ClassVar[str] = ""
    #: how that library installs (harness.backends.install; None = torch alone: nothing to install)
    install: ClassVar["Install | None"] = None
    #: which setting of vLLM, SGLang or transformers runs its kernels (harness.backends.serving; () = none known)
    serving: ClassVar[tuple["ServingKnob", ...]] = ()

    def installed_version(self) -> str | None:
        """The package's version here (torch's when `package` is None), or None where it is not installed."""
        if self.package is None:
            return torch.__version__
        try:
            from importlib.metadata import version
            return version(self.package)
        except Exception:
            return None

    def version(self) -> str:
        return self.installed_version() or "not installed"

    @classmethod
    def version_key(cls) -> str | None:
        """env.json's name for the package's version; None when the backend records torch's."""
        return cls.version_name or (cls.package.replace("-", "_") if cls.package else None)

    def kernels(self) -> str:
        """Which kernels this backend's calls can run here, where it can tell ('' otherwise)."""
        return ""

    def modifier_path(self, case: AttentionCase) -> str:
        """How `case`'s modifiers reach the kernel, for the row's modifier_path column (e.g. 'score_mod')."""
        return ", ".join(sorted(case.modifiers)) + " as forward keywords"

    def mask_form(self, case: AttentionCase, device: torch.device) -> "MaskForm":
        """How this backend's own translation passes `case`'s mask to its kernel (the advisor's deployment checks)."""
        return MaskForm(NOT_DESCRIBED, float("nan"),
                        f"{self.name} has no mask_form(case, device): its mask translation is not described by "
                        "the plugin")

    def compile_time_ms(self) -> float | None:
        """Compile time (ms) of the graph the last call used, for backends that compile; None otherwise."""
        return None


class Backend(ProbeHooks, DescriptionHooks):
    """An attention implementation: what it can run, declared as data; `prepare`, once per case; `forward`, timed.

    Subclasses set `name` and `layout` and implement `forward(q, k, v, *, mask, scale)`: q (batch, heads, seq_q,
    head_dim) for 'bhsd' or (batch, seq_q, heads, head_dim) for 'bshd', k/v likewise with kv_heads, seq_k and v's
    head_dim_v; the output in q's layout with v's head dim (README "Your own kernel"). `can_run` derives every
    reason from the class data below (plus `not_supported_reasons`); `supports` is `not can_run(...)`."""

    name: ClassVar[str] = ""
    layout: ClassVar[str] = "bhsd"
    #: dtypes accepted (None = any)
    dtypes: ClassVar[tuple[torch.dtype, ...] | None] = None
    #: device types accepted, e.g. ("cuda",); None = any
    devices: ClassVar[tuple[str, ...] | None] = None
    max_head_dim: ClassVar[int | None] = None
    supports_backward: ClassVar[bool] = True
    #: device types that have a backward (None = every device the forward runs on)
    backward_devices: ClassVar[tuple[str, ...] | None] = None
    supports_gqa: ClassVar[bool] = True
    #: a deterministic backward: True (declared), a string saying whose documentation claims it, or None
    deterministic: ClassVar[bool | str | None] = None
    #: compiles every new shape (seconds each): the probe suites give it fewer cases in their default tier
    compiles_per_shape: ClassVar[bool] = False
    #: the FLOP rate of its calls as a multiple of a dense GEMM's in the case's dtype, per device type (the cost
    #: model's, harness/planning/cost.py: a job's estimate before it runs); a device type not named: 1.0
    relative_speed: ClassVar[dict[str, float]] = {}
    #: the modifiers forward implements (a subset of harness.cases.modifiers.MODIFIERS)
    modifiers: ClassVar[frozenset[str]] = frozenset()
    #: why the library cannot do an undeclared modifier, where the backend knows (shown in the unsupported row)
    modifier_refusals: ClassVar[dict[str, str]] = {}
    #: v may have a head dim other than q/k's (case.head_dim_v)
    supports_head_dim_v: ClassVar[bool] = False
    #: takes paged KV cases: forward(q, k_cache, v_cache, ..., block_table, cache_seqlens) (harness.cases.paged)
    paged_kv: ClassVar[bool] = False
    #: the page sizes its paged kernel takes are multiples of this (FA2: 256)
    page_size_multiple: ClassVar[int] = 1
    #: takes a mixed serving step (CacheCausal with q_lens, q padded): rows past q_lens[b] must come out 0
    mixed_batch: ClassVar[bool] = False
    #: takes an FP8 KV case (harness.cases.fp8): k, v float8 e4m3fn, k_scale= / v_scale= float32 (1,) or (kv_heads,)
    fp8_kv: ClassVar[bool] = False
    #: takes FP8 q too (case.fp8_q): q_scale= float32 (1,) or (kv_heads,) per kv-head group; the output bfloat16
    fp8_q: ClassVar[bool] = False
    #: its documented limitations: the probe cases expected to fail, each with why (KnownFailure)
    known_failures: ClassVar[tuple[KnownFailure, ...]] = ()

    def prepare(self, case: AttentionCase, device: torch.device) -> Plan | Any:
        """What the call needs that depends only on (case, device), built once outside any timing: a `Plan` (or any
        state) passed to `forward` as `prepared=`; None passes nothing."""
        return None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: MaskSpec | None,
                scale: float) -> torch.Tensor:
        raise NotImplementedError

    def unavailable_reason(self, device: torch.device) -> str | None:
        """Why this backend cannot run at all here (library missing, wrong device, GPU arch); None if it can."""
        if self.devices is not None and device.type not in self.devices:
            return f"{self.name} runs on {'/'.join(self.devices)} only; device is {device.type}"
        return None

    def not_supported_reasons(self, case: AttentionCase) -> list[str]:
        """Every reason this backend cannot run `case`'s forward (empty list = supported). Override to add more."""
        reasons = []
        if self.dtypes is not None and case.dtype not in self.dtypes:
            allowed = ", ".join(dtype_name(d) for d in self.dtypes)
            reasons.append(f"dtype {dtype_name(case.dtype)} not supported (supports {allowed})")
        if self.max_head_dim is not None and case.head_dim > self.max_head_dim:
            reasons.append(f"head_dim {case.head_dim} > max {self.max_head_dim}")
        if not self.supports_gqa and case.kv_heads != case.heads:
            reasons.append(f"GQA/MQA (kv_heads={case.kv_heads} != heads={case.heads}) not supported")
        return reasons

    def can_run(self, case: AttentionCase, device: torch.device, *, backward: bool = False,
                dropout: bool = False) -> list[str]:
        """Every reason this backend cannot run `case` on `device` (empty = it can): the case's forward, plus its
        backward and dropout when asked. Availability on the device is `unavailable_reason`'s question."""
        reasons = list(self.not_supported_reasons(case)) + self.modifier_reasons(case)
        if case.page_size is not None and not self.paged_kv:
            reasons.append(f"{self.name} has no paged KV path (paged_kv=False)")
        elif case.page_size is not None and case.page_size % self.page_size_multiple:
            reasons.append(f"{self.name} needs page_size % {self.page_size_multiple} == 0; page_size={case.page_size}")
        if isinstance(case.mask, CacheCausal) and case.mask.mixed and not self.mixed_batch:
            reasons.append(f"{self.name} takes no mixed serving step (per-sequence query lengths; mixed_batch=False)")
        if case.fp8_kv is not None and not self.fp8_kv:
            reasons.append(f"{self.name} takes no FP8 KV cache (fp8_kv=False)")
        if case.fp8_q and not self.fp8_q:
            reasons.append(f"{self.name} takes no FP8 queries (fp8_q=False)")
        if backward:
            reasons += self.backward_reasons(device)
        if dropout and "dropout" not in self.native_probes:
            reasons.append(f"{self.name} has no dropout (no native_dropout probe)")
        return reasons

    def supports(self, case: AttentionCase, device: torch.device, *, backward: bool = False,
                 dropout: bool = False) -> bool:
        return not self.can_run(case, device, backward=backward, dropout=dropout)

    def known_failure(self, probe: str, case: str, device_type: str) -> str | None:
        """Why `probe`'s case `case` is expected to fail on `device_type`, or None where it is expected to pass."""
        return next((f.why for f in self.known_failures if (f.probe, f.case) == (probe, case)
                     and f.device in (None, device_type)), None)

    def prepared_plan(self, case: AttentionCase, device: torch.device) -> Plan | Any:
        """prepare(case, device), or None when this backend's forward takes no `prepared` (a user's subclass)."""
        params = inspect.signature(type(self).forward).parameters
        if "prepared" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return None
        return self.prepare(case, device)

    def plan_for(self, prepared: Plan | Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                 mask: MaskSpec | None, scale: float, **call_kwargs) -> Plan | Any:
        """`prepared` as the harness built it, or - forward called directly, without it - the plan of the case the
        call's tensors and keywords describe (`case_of`), built now; a paged call's own block table is used."""
        if prepared is not None:
            return prepared
        case = self.case_of(q, k, v, mask=mask, scale=scale, **call_kwargs)
        table = call_kwargs.get("block_table")
        return self.prepare(case, q.device) if table is None else self.prepare(case, q.device, block_table=table)

    def ops(self, plan: Plan | Any, training: bool) -> tuple[str, str]:
        """(forward, backward) kernels a call with `plan` runs: the plan's own, or this backend's name."""
        return plan.ops(training) if isinstance(plan, Plan) else (self.name, self.name)

    def case_of(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None, *, mask: MaskSpec | None,
                scale: float, block_table: torch.Tensor | None = None, cache_seqlens: torch.Tensor | None = None,
                softcap: float | None = None, sinks: torch.Tensor | None = None,
                alibi_slopes: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> AttentionCase:
        """The case that tensors in this backend's layout and forward's keywords describe (for `prepare` when forward
        is called without `prepared`). With a block_table, k is the paged cache."""
        b, h, sq, d = self.from_layout(q).shape
        if block_table is not None:  # the cache: (num_blocks, page_size, kv_heads, head_dim)
            if not isinstance(mask, CacheCausal):
                raise ValueError(f"a paged call needs mask=CacheCausal(lengths); got {getattr(mask, 'id', mask)!r}")
            return AttentionCase(b, h, sq, d, q.dtype, kv_heads=k.shape[2], seq_k=max(mask.lengths), mask=mask,
                                 scale=scale, page_size=k.shape[1])
        k = self.from_layout(k)
        return AttentionCase(b, h, sq, d, q.dtype, kv_heads=k.shape[1], seq_k=k.shape[2], mask=mask, scale=scale,
                             head_dim_v=d if v is None else v.shape[-1], softcap=softcap, sinks=sinks is not None,
                             alibi=alibi_slopes is not None,
                             bias=None if bias is None else ("head" if bias.shape[0] == 1 else "full"))

    def to_layout(self, x: torch.Tensor) -> torch.Tensor:
        """Canonical (B, H, S, D) <-> this backend's layout (a transpose, its own inverse); done before timing."""
        return x if self.layout == "bhsd" else x.transpose(1, 2)

    from_layout = to_layout

    def backward_reasons(self, device: torch.device) -> list[str]:
        """Why there is no backward here, from the capability data (empty = there is one)."""
        if not self.supports_backward:
            return [f"{self.name} has no backward"]
        if self.backward_devices is not None and device.type not in self.backward_devices:
            return [f"{self.name} has no backward on {device.type} (torch {torch.__version__})"]
        return []

    def modifier_reasons(self, case: AttentionCase) -> list[str]:
        """Why this backend cannot take `case`'s modifiers or value head dim, from the declarations (empty = it can)."""
        unknown = set(self.modifiers) - set(MODIFIERS)
        if unknown:
            raise ValueError(f"{type(self).__name__}.modifiers has {sorted(unknown)}; allowed: {', '.join(MODIFIERS)}")
        reasons = [f"{self.name} does not take the {m} modifier: "
                   + self.modifier_refusals.get(m, "not declared in its `modifiers`")
                   for m in MODIFIERS if m in case.modifiers and m not in self.modifiers]
        if case.head_dim_v != case.head_dim and not self.supports_head_dim_v:
            reasons.append(f"head_dim_v {case.head_dim_v} != head_dim {case.head_dim}: "
                           + self.modifier_refusals.get("head_dim_v", f"{self.name} needs equal head dims "
                                                        "(supports_head_dim_v is False)"))
        return reasons


class FlashFamily(Backend):
    """The declaration FlashAttention-2/3/4 and FlashInfer share: (batch, seq, heads, head_dim), fp16/bf16, CUDA
    only, head dims up to 256."""

    layout = "bshd"
    dtypes = (torch.float16, torch.bfloat16)
    devices = ("cuda",)
    max_head_dim = 256


def refusal(translate: Callable[..., Any], *args) -> list[str]:
    """[why] when translate(*args) raises Unsupported (a translation's refusal as a reason), else []."""
    try:
        translate(*args)
    except Unsupported as exc:
        return [str(exc)]
    return []


def cuda_import_problem(name: str, device: torch.device, module: str, what: str, hint: str,
                        arch_ok: Callable[[int], bool], arch_need: str) -> str | None:
    """Why backend `name` cannot run here: `module` not importable (`what` it is, its error, `hint`), no CUDA, or a GPU
    whose compute capability's major `arch_ok` refuses (`arch_need`: what it needs)."""
    try:
        importlib.import_module(module)
    except Exception as exc:
        return f"{what} not importable ({type(exc).__name__}: {exc}); {hint}"
    if device.type != "cuda":
        return f"{name} needs CUDA; device is {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    return None if arch_ok(major) else f"{arch_need}; device is sm{major}{minor}"


#: the mask path of a backend that does not describe its translation (a plugin without `mask_form`)
NOT_DESCRIBED = "not described by the plugin"


@dataclass(frozen=True)
class MaskForm:
    """How a mask reaches a kernel: 'native' (flags, typed masks, block masks), 'dense' (a materialized tensor of
    `dense_bytes`), 'none', 'unsupported', 'unknown' (the translation failed) or NOT_DESCRIBED, with a short note."""

    path: str
    dense_bytes: float
    note: str

    def as_columns(self) -> dict:
        return {"mask_path": self.path, "dense_mask_bytes": self.dense_bytes, "mask_note": self.note}

    @staticmethod
    def dense(t: torch.Tensor, what: str) -> "MaskForm":
        """A materialized mask tensor, counted at its full logical shape or its storage when larger (xformers pads
        rows to 8): an expanded view costs its full size as soon as a kernel makes it contiguous."""
        size = max(t.numel() * t.element_size(), t.untyped_storage().nbytes())
        return MaskForm("dense", size, f"{what} {str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}")
