"""FlexAttention, compiled per (shape, mask): the spec's predicate as mask_mod, its formulas as score_mod, sinks."""

from __future__ import annotations

import os

import time
from dataclasses import dataclass
from functools import lru_cache

import torch

from harness.backends.base import Backend, KnownFailure, MaskForm, Plan, Unsupported
from harness.backends.fp8_dequant import dequant_note, dequantized_inputs
from harness.backends.registry import register
from harness.cases.masks import MaskSpec
from harness.cases.modifiers import alibi_term, softcap_scores
from harness.cases.paged import paged_layout
from harness.backends.serving import ServingKnob


def flex_mask_mod(mask: MaskSpec, seq_q: int, seq_k: int, device="cpu"):
    """Mask spec -> flex mask_mod(b, h, q_idx, kv_idx) calling the spec's single definition of visibility."""
    allows = mask.predicate(device)

    def mask_mod(b, h, q_idx, kv_idx):
        return allows(b, q_idx, kv_idx, seq_q, seq_k)

    return mask_mod


def flex_score_mod(seq_q: int, seq_k: int, *, softcap: float | None = None, alibi_slopes: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None, batch: int = 1):
    """The modifiers -> flex score_mod(score, b, h, q_idx, kv_idx) with the spec's formulas in its order (cap, ALiBi,
    bias; flex applies the BlockMask after it), or None without any; bias (B|1, H, Sq, Sk) via an expanded view."""
    if softcap is None and alibi_slopes is None and bias is None:
        return None
    full = None if bias is None else bias.expand(batch, *bias.shape[1:])

    def score_mod(score, b, h, q_idx, kv_idx):
        if softcap is not None:
            score = softcap_scores(score, softcap)
        if alibi_slopes is not None:
            score = score + alibi_term(alibi_slopes[h], q_idx, kv_idx, seq_q, seq_k)
        if full is not None:
            score = score + full[b, h, q_idx, kv_idx]
        return score

    return score_mod


def sink_corrected(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Attention without the sink -> with it: out * sigmoid(lse - sigma_h) (the sink adds exp(sigma_h) to the row's
    denominator exp(lse)), differentiable. out (B, H, Sq, Dv); lse (B, H, Sq) natural log; an empty row stays 0."""
    weight = torch.sigmoid(lse.float() - sinks.float().view(1, -1, 1))
    return (out.float() * weight.unsqueeze(-1)).to(out.dtype)


def paged_mask_mod(mask: MaskSpec, block_table: torch.Tensor, num_blocks: int, page_size: int, seq_q: int, seq_k: int):
    """Mask spec + block table -> a mask_mod over the PHYSICAL cache (attention-gym's examples/paged_attention):
    physical key kv_idx is at slot kv_idx % page_size of page kv_idx // page_size, logical page `logical_page[b,
    page]` of sequence b (-1: not b's); the spec's own predicate decides on the logical position."""
    allows = mask.predicate(block_table.device)
    batch, max_blocks = block_table.shape
    logical_page = torch.full((batch, num_blocks), -1, dtype=torch.int64, device=block_table.device)
    logical_page.scatter_(1, block_table.long(), torch.arange(max_blocks, device=block_table.device).expand(batch, -1))

    def mask_mod(b, h, q_idx, kv_idx):
        page = logical_page[b, kv_idx // page_size]
        position = page * page_size + kv_idx % page_size
        return (page >= 0) & (position < seq_k) & allows(b, q_idx, position, seq_q, seq_k)

    return mask_mod


def physical_kv(cache: torch.Tensor) -> torch.Tensor:
    """(num_blocks, page_size, kv_heads, head_dim) cache -> (1, kv_heads, num_blocks * page_size, head_dim), a view:
    one batch of keys that flex broadcasts over the queries' batch (the block mask has the queries' batch)."""
    return cache.flatten(0, 1).unsqueeze(0).transpose(1, 2)


#: compiled graphs allowed per code object: every (shape, mask) is its own graph, ~880 in the full GPU matrix
RECOMPILE_LIMIT = 100_000


#: static shapes: on the CPU (torch 2.13) dynamic=True compiled 1/3 faster but its kernels ran a median 1.44x (up to
#: 5.7x) slower and 19 of 35 default cases failed to compile (benchmarks/flex_compile_study.py, docs/measurements.md)
DYNAMIC = False


#: dynamo's settings flex's calls need (process-wide: a user's process gets them back, calls/caller.py). Past
#: either limit (torch 2.13: 8 per code object, 256 over all its graphs) dynamo silently runs the function eagerly,
#: unfused and materializing scores: raise both, and make hitting one anyway an error.
DYNAMO_SETTINGS = {**dict.fromkeys(("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                                    "accumulated_cache_size_limit"), RECOMPILE_LIMIT),
                   "fail_on_recompile_limit_hit": True}


def raise_recompile_limits() -> None:
    """DYNAMO_SETTINGS applied (again: a check from Python puts them back when it returns)."""
    from torch._dynamo import config as dynamo_config

    for attr, value in DYNAMO_SETTINGS.items():
        if hasattr(dynamo_config, attr):
            setattr(dynamo_config, attr, value)


@lru_cache(maxsize=None)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    raise_recompile_limits()
    return torch.compile(flex_attention, dynamic=DYNAMIC, options=_vector_width())


def _vector_width() -> dict:
    """Inductor's CPU vector width, stated as the one this process dispatches (torch.backends.cpu): inductor picks
    it from ATEN_CPU_CAPABILITY, but its FX graph cache key (torch 2.13, _inductor/codecache.py) holds only its
    config, so a graph compiled for AVX-512 was served to a process run with ATEN_CPU_CAPABILITY=avx2 - wrong
    answers and segfaults. Stated as `cpp.simdlen`, the width is in the key."""
    bits = {"AVX2": 256, "AVX512": 512}.get(torch.backends.cpu.get_cpu_capability())
    return {"cpp.simdlen": bits} if bits else {}


@dataclass
class FlexPlan(Plan):
    """The case's BlockMask on the device (None: no mask); a paged case's is over the physical cache."""

    block_mask: object


@register
class Flex(Backend):
    name = "flex"
    colour, marker = "#ff7f0e", "X"
    library = "FlexAttention"
    #: vLLM FLEX_ATTENTION (the enum of 0.10.2 on; vllm/v1/attention/backends/flex_attention.py), SGLang
    #: flex_attention (choices of 0.5.3 on), transformers flex_attention (4.47.0 on)
    serving = (ServingKnob("vllm", "FLEX_ATTENTION", "0.10.2"),
               ServingKnob("sglang", "flex_attention", "0.5.3", note="no CUDA graphs, no speculative decoding"),
               ServingKnob("transformers", "flex_attention", "4.47.0"))
    known_failures = (
        KnownFailure("empty", "seq_q0", "compiled flex_attention kills the process with SIGFPE on CPU for seq_q=0 (seen "
                                        "with torch 2.13; eager flex returns the empty output)", device="cpu"),
        KnownFailure("empty", "seq_k0", "compiled flex_attention kills the process with SIGFPE on CPU for seq_k=0 (seen "
                                        "with torch 2.13; eager flex raises IndexError)", device="cpu"),
    )
    layout = "bhsd"
    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    native_probes = frozenset({"mask"})
    compiles_per_shape = True
    #: its compiled forward on the 2-core VM: 0.08-0.33 of the GEMM rate (docs/measurements.md)
    relative_speed = {"cpu": 0.16}
    backward_devices = ("cuda",)  # FlexAttention has no backward on CPU
    #: softcap, ALiBi and bias as a score_mod; sinks from the log-sum-exp flex returns (return_aux)
    modifiers = frozenset({"softcap", "alibi", "bias", "sinks"})
    supports_head_dim_v = True
    paged_kv = True  # a mask_mod over the physical cache (paged_mask_mod), no gather
    mixed_batch = True  # through the same mask_mod (padding rows see no key: flex gives them 0)
    fp8_kv = True  # dequantized inside the timed call (flex has no FP8 K/V), then attended as any case
    fp8_q = True  # q likewise

    def __init__(self):
        self._block_masks: dict = {}
        #: milliseconds spent in the first (compiling) call of each (shape, mask) key, for reporting
        self.compile_ms: dict = {}
        self._last_key = None

    def unavailable_reason(self, device):
        try:
            import torch.nn.attention.flex_attention  # noqa: F401
        except ImportError as exc:
            return f"flex_attention not in this torch ({torch.__version__}): {exc}"
        # inductor compiles flex on a CPU only through its AVX2 path: torch 2.13's _inductor/kernel/flex/flex_cpu.py
        # check_cpu_supported (AVX2 and ATEN_CPU_CAPABILITY != "default"), else every call raises "torch.compile on
        # current platform is not supported for CPU"; the capability in use is public (it follows that variable)
        capability = torch.backends.cpu.get_cpu_capability()
        if torch.device(device).type == "cpu" and not capability.startswith("AVX"):
            chosen = os.environ.get("ATEN_CPU_CAPABILITY", "unset")
            return (f"flex on a CPU needs inductor's AVX2 code path; this process dispatches {capability} "
                    f"(ATEN_CPU_CAPABILITY={chosen}; torch {torch.__version__})")
        return None

    def native_mask(self, q, k, v, *, mask, scale):
        """A dense mask in flex's own forms: a bool one as a mask_mod looking it up, an additive one as a score_mod."""
        from torch.nn.attention.flex_attention import create_block_mask
        b, h, sq, _ = q.shape
        dense = mask.expand(b, h, sq, k.shape[2]).contiguous()
        if dense.dtype == torch.bool:
            block_mask = create_block_mask(lambda b_, h_, q_, k_: dense[b_, h_, q_, k_], b, h, sq, k.shape[2],
                                           device=str(q.device))
            return _compiled_flex()(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=k.shape[1] != h)
        return _compiled_flex()(q, k, v, score_mod=lambda s, b_, h_, q_, k_: s + dense[b_, h_, q_, k_], scale=scale,
                                enable_gqa=k.shape[1] != h)

    def mask_form(self, case, device):
        flex_mask_mod(case.mask, case.seq_q, case.seq_k, device)  # the spec's predicate as a mask_mod: block-sparse
        return MaskForm("native", 0, "mask_mod -> BlockMask")

    def block_mask(self, mask: MaskSpec | None, batch: int, seq_q: int, seq_k: int, device):
        if mask is None:
            return None
        key = (mask, batch, seq_q, seq_k, str(device))
        if key not in self._block_masks:
            from torch.nn.attention.flex_attention import create_block_mask
            b = batch if mask.per_batch else None
            self._block_masks[key] = create_block_mask(flex_mask_mod(mask, seq_q, seq_k, device), b, None, seq_q, seq_k,
                                                       device=str(device))
        return self._block_masks[key]

    def modifier_path(self, case):
        parts = [f"score_mod ({', '.join(m for m in ('softcap', 'alibi', 'bias') if m in case.modifiers)})"
                 if case.modifiers - {"sinks"} else "", "sinks: out * sigmoid(lse - sigma)" if case.sinks else ""]
        return " + ".join(p for p in parts if p)

    def prepare(self, case, device, block_table: torch.Tensor | None = None) -> FlexPlan:
        """The BlockMask of the case's mask on the device (built once per (mask, shape, device)); None: no mask. A
        paged case's is over the physical cache, from `block_table` (default: the case's)."""
        raise_recompile_limits()  # once a case, outside the timed calls
        fp8 = dequant_note(case)
        if case.page_size is not None:
            return FlexPlan(op=f"{self.name} (paged block mask over the physical cache){fp8}",
                            block_mask=self.paged_block_mask(case, device, block_table))
        return FlexPlan(op=self.name + fp8,
                        block_mask=self.block_mask(case.mask, case.batch, case.seq_q, case.seq_k, device))

    def paged_block_mask(self, case, device, block_table: torch.Tensor | None = None):
        from torch.nn.attention.flex_attention import create_block_mask
        layout = paged_layout(case, device)
        table = layout.block_table if block_table is None else block_table
        key = ("paged", case.mask, case.page_size, tuple(table.shape), case.seq_q, str(device))
        if key not in self._block_masks or block_table is not None:
            mod = paged_mask_mod(case.mask, table, layout.num_blocks, case.page_size, case.seq_q, case.seq_k)
            self._block_masks[key] = create_block_mask(mod, case.batch, None, case.seq_q,
                                                       layout.num_blocks * case.page_size, device=str(device))
        return self._block_masks[key]

    def forward(self, q, k, v, *, mask, scale, prepared: FlexPlan | None = None, softcap=None, sinks=None,
                alibi_slopes=None, bias=None, block_table=None, cache_seqlens=None, k_scale=None, v_scale=None,
                q_scale=None):
        block_mask = self.plan_for(prepared, q, k, v, mask=mask, scale=scale, softcap=softcap, sinks=sinks,
                                   alibi_slopes=alibi_slopes, bias=bias, block_table=block_table).block_mask
        if k_scale is not None:  # an FP8 cache (the whole physical cache when paged: flex reads through the mask)
            q, k, v = dequantized_inputs(q, k, v, k_scale, v_scale, q_scale, self.layout,
                                         "paged" if block_table is not None else self.layout)
        if block_table is not None:  # paged: attend the physical cache through a paged block mask
            k, v = physical_kv(k), physical_kv(v)
        kwargs = dict(score_mod=flex_score_mod(q.shape[2], k.shape[2], softcap=softcap, alibi_slopes=alibi_slopes,
                                               bias=bias, batch=q.shape[0]),
                      block_mask=block_mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
        if sinks is not None:
            from torch.nn.attention.flex_attention import AuxRequest
            if q.device.type == "cpu":  # seen with torch 2.13: InductorError "... `return_lse` is not supported yet"
                raise Unsupported(f"flex sinks need the returned log-sum-exp, which compiled flex on CPU does not give "
                                  f"(torch {torch.__version__}: inductor CPU supports inference only, no return_lse)")
            kwargs["return_aux"] = AuxRequest(lse=True)
        if torch.compiler.is_compiling():  # inside a user's torch.compile: no host timing (a graph break)
            from torch.nn.attention.flex_attention import flex_attention
            return self._sinks(flex_attention(q, k, v, **kwargs), sinks)
        key = (tuple(q.shape), tuple(k.shape), v.shape[-1], q.dtype, str(q.device), mask, q.requires_grad,
               (softcap, alibi_slopes is not None, bias is not None and tuple(bias.shape), sinks is not None))
        first = key not in self.compile_ms
        start = time.perf_counter()
        out = _compiled_flex()(q, k, v, **kwargs)
        if first:
            self.compile_ms[key] = (time.perf_counter() - start) * 1e3
        self._last_key = key
        return self._sinks(out, sinks)

    @staticmethod
    def _sinks(out, sinks):
        """With sinks, flex returned (out, aux): the sink's correction from aux.lse."""
        return out if sinks is None else sink_corrected(out[0], out[1].lse, sinks)

    def compile_time_ms(self):
        return self.compile_ms.get(self._last_key)
