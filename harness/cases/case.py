"""The case spec: one frozen, validated description of an attention problem, and its inputs."""

from __future__ import annotations

import math
import functools
from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple

import torch

from harness.cases import fp8, modifiers as mods
from harness.cases.case_id import parse_case_id
from harness.cases.masks import CacheCausal, MaskSpec
from harness.cases.masks.cache_causal import ID_LENGTHS, cache_lengths
from harness.store.schema import BWD, FWD, GRADS

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                                  "fp64": torch.float64}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def parse_dtype(value: str | torch.dtype) -> torch.dtype:
    """'bf16' / 'bfloat16' / torch.bfloat16 -> torch.bfloat16; anything else is a ValueError."""
    if isinstance(value, torch.dtype):
        if value not in _DTYPE_NAMES:
            raise ValueError(f"dtype {value}: allowed {', '.join(DTYPES)}")
        return value
    aliases = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float64": "fp64",
               "float": "fp32", "double": "fp64"}
    key = aliases.get(str(value), str(value))
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {value!r}; allowed: {', '.join(DTYPES)}")
    return DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES[dtype]


def number_token(value: float) -> str:
    """A float as a case id writes it: '%g' (30, 0.125) where that reads back exactly, else its shortest repr."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


@dataclass(frozen=True)
class AttentionCase:
    """One attention problem. q: (batch, heads, seq_q, head_dim); k: (batch, kv_heads, seq_k, head_dim); v: (batch,
    kv_heads, seq_k, head_dim_v). Query head h uses kv head h // (heads // kv_heads) (GQA; MQA when kv_heads is 1).
    softcap, sinks, alibi and bias: harness.cases.modifiers (docs/variants.md)."""

    batch: int
    heads: int
    seq_q: int
    head_dim: int
    dtype: torch.dtype
    kv_heads: int | None = field(default=None, kw_only=True)
    seq_k: int | None = field(default=None, kw_only=True)
    mask: MaskSpec | None = field(default=None, kw_only=True)
    scale: float | None = field(default=None, kw_only=True)
    softcap: float | None = field(default=None, kw_only=True)
    sinks: bool = field(default=False, kw_only=True)
    alibi: bool = field(default=False, kw_only=True)
    bias: str | None = field(default=None, kw_only=True)
    head_dim_v: int | None = field(default=None, kw_only=True)
    #: a paged KV cache of pages of this many keys (mask=CacheCausal(lengths), seq_k the longest); None: contiguous
    page_size: int | None = field(default=None, kw_only=True)
    #: an FP8 (e4m3fn) KV cache with a float32 scale per "tensor" or per kv "head" (harness.cases.fp8)
    fp8_kv: str | None = field(default=None, kw_only=True)
    #: q float8 e4m3fn too, scaled per fp8_kv's granularity: an FP8 Q/K/V case (FlashAttention-3's), dtype bf16
    fp8_q: bool = field(default=False, kw_only=True)

    def __post_init__(self):
        for name in ("batch", "heads", "seq_q", "head_dim"):
            mods.validate_int(name, getattr(self, name))
        object.__setattr__(self, "dtype", parse_dtype(self.dtype))
        kv_heads = self.heads if self.kv_heads is None else mods.validate_int("kv_heads", self.kv_heads)
        if self.heads % kv_heads:
            raise ValueError(f"heads={self.heads} is not a multiple of kv_heads={kv_heads}")
        object.__setattr__(self, "kv_heads", kv_heads)
        object.__setattr__(self, "seq_k", self.seq_q if self.seq_k is None else mods.validate_int("seq_k", self.seq_k))
        if self.mask is not None:
            if not isinstance(self.mask, MaskSpec):
                raise ValueError(f"mask={self.mask!r}: must be a harness.masks spec or None")
            self.mask.validate_for(self.batch, self.seq_q, self.seq_k)
        scale = 1.0 / math.sqrt(self.head_dim) if self.scale is None else self.scale
        if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale={self.scale!r}: must be a finite float > 0")
        object.__setattr__(self, "scale", float(scale))
        object.__setattr__(self, "softcap", mods.validate_softcap(self.softcap))
        mods.validate_flag("sinks", self.sinks)
        mods.validate_flag("alibi", self.alibi)
        mods.validate_bias(self.bias)
        object.__setattr__(self, "head_dim_v", self.head_dim if self.head_dim_v is None
                           else mods.validate_int("head_dim_v", self.head_dim_v))
        if self.page_size is not None:
            validate_paged_case(self)
        if fp8.validate_fp8_kv(self.fp8_kv) is not None and (self.modifiers or self.dtype == torch.float64):
            raise ValueError(f"fp8_kv={self.fp8_kv!r}: an FP8 KV case takes no modifiers and a dtype of fp32, fp16 or "
                             f"bf16 for q; got modifiers {self.modifier_id}, dtype {dtype_name(self.dtype)}")
        if mods.validate_flag("fp8_q", self.fp8_q) and (self.fp8_kv is None or self.dtype != fp8.FP8_Q_DTYPE):
            raise ValueError(f"fp8_q=True: FP8 queries need an FP8 KV cache (fp8_kv 'tensor' or 'head') and dtype "
                             f"{dtype_name(fp8.FP8_Q_DTYPE)} (the FP8 kernels' output); got fp8_kv={self.fp8_kv!r}, "
                             f"dtype {dtype_name(self.dtype)}")

    @property
    def modifiers(self) -> frozenset[str]:
        present = (self.softcap is not None, self.sinks, self.alibi, self.bias is not None)  # in MODIFIERS' order
        return frozenset(name for name, on in zip(mods.MODIFIERS, present) if on)

    @property
    def modifier_id(self) -> str:
        """The modifiers as case-id tokens, e.g. 'cap30-sink' ('none' without any)."""
        parts = [f"cap{number_token(self.softcap)}" if self.softcap is not None else "", "sink" if self.sinks else "",
                 "alibi" if self.alibi else "", mods.BIAS_TOKENS[self.bias] if self.bias else ""]
        return "-".join(p for p in parts if p) or "none"

    @property
    def grads(self) -> tuple[str, ...]:
        """dq, dk, dv, then dsinks and dbias where the case has them."""
        return GRADS + tuple(g for m, g in mods.MODIFIER_GRADS.items() if m in self.modifiers)

    @property
    def default_scale(self) -> bool:
        return math.isclose(self.scale, 1.0 / math.sqrt(self.head_dim), rel_tol=1e-12)

    @property
    def query_tokens(self) -> int:
        """Query rows that carry a token: batch x seq_q, or a mixed serving step's sum of CacheCausal.q_lens."""
        mixed = isinstance(self.mask, CacheCausal) and self.mask.mixed
        return sum(self.mask.q_lens) if mixed else self.batch * self.seq_q

    @property
    def mask_id(self) -> str:
        return "none" if self.mask is None else self.mask.id

    @property
    def mask_kind(self) -> str:
        return "none" if self.mask is None else self.mask.kind

    @property
    def id(self) -> str:
        """Stable readable id, e.g. 'fp32-b1-h8kv2-s113x203-d64-none', 'bf16-b1-h16-s512-d192v128-causal-cap30'."""
        return self._id(self.mask_id)

    @property
    def spelled_id(self) -> str:
        """The id with a long cache mask's digest spelled out: `AttentionCase.from_id` reads any case back from it."""
        return self._id("none" if self.mask is None else self.mask.spelled_id)

    @classmethod
    def from_id(cls, text: str) -> "AttentionCase":
        """The case whose id (or spelled_id) is `text`; a one-line ValueError naming the malformed part otherwise."""
        fields, digest = parse_case_id(text)
        if digest:
            return known_case(text)
        try:
            return cls(**fields)
        except ValueError as exc:
            raise ValueError(f"case id {text!r}: {exc}") from None

    def _id(self, mask_token: str) -> str:
        heads = f"h{self.heads}" + (f"kv{self.kv_heads}" if self.kv_heads != self.heads else "")
        seq = f"s{self.seq_q}" + (f"x{self.seq_k}" if self.seq_k != self.seq_q else "")
        dims = f"d{self.head_dim}" + (f"v{self.head_dim_v}" if self.head_dim_v != self.head_dim else "")
        parts = [dtype_name(self.dtype), f"b{self.batch}", heads, seq, dims, mask_token,
                 self.modifier_id if self.modifiers else "",
                 "" if self.default_scale else f"scale{number_token(self.scale)}",
                 "" if self.page_size is None else f"page{self.page_size}",
                 "" if self.fp8_kv is None else f"fp8{'qkv' if self.fp8_q else 'kv'}-{self.fp8_kv}"]
        return "-".join(p for p in parts if p)

    def key_mask(self, device: str | torch.device = "cpu", rows: tuple[int, int] | None = None) -> torch.Tensor | None:
        """Dense bool mask (B or 1, 1, rows, seq_k) for this case, or None when nothing is masked."""
        return None if self.mask is None else self.mask.materialize(self.seq_q, self.seq_k, device, batch=self.batch,
                                                                    rows=rows)


class Inputs(NamedTuple):
    """Canonical q/k/v, d_out, and the modifiers' sinks (heads,) and bias (batch or 1, heads, seq_q, seq_k) or None."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    d_out: torch.Tensor
    sinks: torch.Tensor | None = None
    bias: torch.Tensor | None = None

    def map(self, fn) -> "Inputs":
        return Inputs(*(None if t is None else fn(t) for t in self))


def input_shapes(case: AttentionCase) -> list[tuple[int, ...]]:
    """The canonical shapes of q, k, v and d_out, in that order."""
    b, h, hkv, sq, sk = case.batch, case.heads, case.kv_heads, case.seq_q, case.seq_k
    return [(b, h, sq, case.head_dim), (b, hkv, sk, case.head_dim), (b, hkv, sk, case.head_dim_v),
            (b, h, sq, case.head_dim_v)]


def answer_elements(case: AttentionCase, phase: str) -> int:
    """Elements of the answers a call of `phase` returns: out (fwd: d_out's shape), dq, dk, dv (bwd: q's, k's and
    v's shapes), all four (fwd+bwd)."""
    q, k, v, out = (math.prod(shape) for shape in input_shapes(case))
    return {FWD: out, BWD: q + k + v}.get(phase, out + q + k + v)


def shaped(case: AttentionCase, drawn: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Standard normal draws of q, k, v and d_out (float32, canonical; None: not drawn) given the case's ranges: an
    FP8 case's heads of different magnitudes, a softcap case's scores of SOFTCAP_SCORE_STD caps."""
    drawn = list(drawn)

    def scaled(i: int, factor: torch.Tensor | float) -> None:
        if drawn[i] is not None:
            drawn[i] = drawn[i] * (factor.to(drawn[i].device) if isinstance(factor, torch.Tensor) else factor)

    if case.fp8_kv is not None:  # heads of different ranges, k's unlike v's (harness.cases.fp8.magnitudes)
        k_mag, v_mag = fp8.magnitudes(case.kv_heads)
        scaled(1, k_mag.view(1, -1, 1, 1))
        scaled(2, v_mag.view(1, -1, 1, 1))
    if case.fp8_q:  # q's kv-head groups of different ranges too (harness.cases.fp8.query_magnitudes)
        scaled(0, fp8.per_query_head(fp8.query_magnitudes(case.kv_heads), case.heads).view(1, -1, 1, 1))
    if case.softcap is not None:  # std(scale q.k) = scale sqrt(d) for N(0,1) q, k: make it SOFTCAP_SCORE_STD caps
        scaled(0, mods.SOFTCAP_SCORE_STD * case.softcap / (case.scale * math.sqrt(case.head_dim)))
    return drawn


def make_inputs(case: AttentionCase, device: str | torch.device = "cpu", seed: int = 0) -> Inputs:
    """Deterministic torch.randn inputs from `seed`, drawn in float32 on CPU (the same values on every device and
    dtype), then cast and moved; the modifiers' tensors are drawn after q, k, v, d_out, only when present."""
    gen = torch.Generator().manual_seed(seed)
    drawn = shaped(case, [torch.randn(s, generator=gen, dtype=torch.float32) for s in input_shapes(case)])
    h, sk = case.heads, case.seq_k
    sinks = torch.randn(h, generator=gen) * mods.SINK_STD + (math.log(sk) + 0.5) if case.sinks else None
    bias = None if case.bias is None else torch.randn((1 if case.bias == "head" else case.batch, h, case.seq_q, sk),
                                                      generator=gen)
    return Inputs(*drawn, sinks, bias).map(lambda t: t.to(device=device, dtype=case.dtype))


def paged_case(batch: int, heads: int, seq_q: int, head_dim: int, dtype, *, kv_heads: int, cache: int,
               page_size: int, **modifiers) -> AttentionCase:
    """A decode (seq_q = 1) or verification (seq_q = 2-8) step over paged caches of about `cache` keys."""
    lengths = cache_lengths(cache, batch)
    return AttentionCase(batch, heads, seq_q, head_dim, dtype, kv_heads=kv_heads, seq_k=max(lengths),
                         mask=CacheCausal(lengths), page_size=page_size, **modifiers)


#: where a case id holding a digest is looked up: callables giving cases (spec.matrices and spec.presets add theirs
#: when imported, as backends register), since such an id alone does not hold its cache lengths
CASE_SOURCES: list[Callable[[], Iterable[AttentionCase]]] = []


def known_case(text: str) -> AttentionCase:
    """The case of CASE_SOURCES whose id is `text` (a digest id); a one-line ValueError when none is."""
    found = _catalog().get(text)
    if found is None:
        raise ValueError(f"case id {text!r}: its cache mask is a digest of more than {ID_LENGTHS} cache lengths and "
                         "no case of a matrix or preset has it; give the case's spelled-out id (every length listed, "
                         "as the repro command prints it)")
    return found


@functools.lru_cache(maxsize=1)
def _catalog() -> dict[str, AttentionCase]:
    """Every case of CASE_SOURCES by id (built once, on the first digest asked for)."""
    return {c.id: c for source in CASE_SOURCES for c in source()}


def validate_paged_case(case: AttentionCase) -> None:
    """A paged case's rules: pages of an int size, CacheCausal lengths, no modifiers yet, seq_k its longest cache."""
    page = case.page_size
    if not isinstance(page, int) or isinstance(page, bool) or page < 1:
        raise ValueError(f"page_size={page!r}: must be an int >= 1 (or None for a contiguous cache)")
    if not isinstance(case.mask, CacheCausal):
        raise ValueError(f"page_size={page} needs mask=CacheCausal(lengths) (the per-sequence cache lengths); got "
                         f"{case.mask_id}")
    if case.modifiers or case.head_dim_v != case.head_dim:
        raise ValueError(f"page_size={page}: paged cases take no modifiers and no head_dim_v yet; got modifiers "
                         f"{case.modifier_id}, head_dim_v={case.head_dim_v} (head_dim {case.head_dim})")
    if max(case.mask.lengths) != case.seq_k:
        raise ValueError(f"seq_k={case.seq_k}: a paged case's seq_k is its longest cache, "
                         f"max(CacheCausal.lengths)={max(case.mask.lengths)}")
