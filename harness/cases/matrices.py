"""Named case matrices: for a CPU (smoke, default, full) and for a GPU (gpu-smoke, gpu, gpu-full), plus 'auto'."""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product
from typing import Callable

from harness.cases.case import CASE_SOURCES, AttentionCase, paged_case, parse_dtype
from harness.cases.masks import Causal, CausalBottomRight, KeyPadding, SlidingWindow, parse_mask
from harness.cases.serving_step import CPU_MIX, StepMix, serving_step

#: --matrix auto: the GPU matrix on a CUDA device, the CPU default elsewhere
AUTO = "auto"
#: --matrix fuzz: seeded random cases within each backend's declarations (harness.fuzzing.space), no fixed matrix
FUZZ = "fuzz"
#: the masks the CPU matrices ask every question with (fixed: newer names must not grow the CPU matrices)
CPU_MASKS = ("none", "causal", "causal-br", "window", "keypad", "causal+keypad")
#: tokens per batch in the GPU matrices: batch = TOKENS // seq, as FlashAttention's benchmarks do
TOKENS = 16384


def _cases(dtypes, shapes, masks, head_dims, heads=((4, 4),), batch=2) -> list[AttentionCase]:
    return [AttentionCase(batch, h, sq, d, parse_dtype(dtype), kv_heads=hkv, seq_k=sk,
                          mask=parse_mask(mask, batch=batch, seq_k=sk, seq_q=sq))
            for dtype, (sq, sk), mask, d, (h, hkv) in product(dtypes, shapes, masks, head_dims, heads)]


def _tokens(dtypes, seqs, masks, shapes) -> list[AttentionCase]:
    """Square cases at TOKENS tokens per batch: seq in `seqs`, (heads, kv_heads, head_dim) in `shapes`."""
    return [c for dtype, seq, mask, (h, hkv, d) in product(dtypes, seqs, masks, shapes)
            for c in _cases([dtype], [(seq, seq)], [mask], [d], heads=((h, hkv),), batch=max(1, TOKENS // seq))]


def decode_batch(kv_len: int, cached_tokens: int = 262144, most: int = 16) -> int:
    """Sequences one decode step batches: up to `most`, with at most `cached_tokens` cached keys in all - the
    float64 reference holds six KV-sized tensors (128k keys x 8 heads x 128 x 8 B x 6 = 6 GiB per sequence)."""
    return max(1, min(most, cached_tokens // kv_len))


def _decode(kv_lengths, cached_tokens: int = 262144) -> list[AttentionCase]:
    """One new token over a KV cache (GQA 32/8, d128, as Llama-3-8B decodes): every cached key is visible."""
    return [c for n in kv_lengths for c in _cases(["bf16"], [(1, n)], ["none"], [128], heads=((32, 8),),
                                                  batch=decode_batch(n, cached_tokens))]


def _paged(caches, q_lens, page_sizes, *, dtype="bf16", shape=(32, 8, 128),
           batch: int | None = None) -> list[AttentionCase]:
    """Paged-KV decode (q_len 1) and verification (q_len 2-8) over caches of about each length in `caches`."""
    h, hkv, d = shape
    return [paged_case(batch or decode_batch(n), h, q, d, parse_dtype(dtype), kv_heads=hkv, cache=n,
                       page_size=p) for n, q, p in product(caches, q_lens, page_sizes)]


def _steps(caches, page_sizes, *, dtype="bf16", shape=(32, 8, 128), mix: StepMix = StepMix()) -> list[AttentionCase]:
    """Mixed serving steps over caches of about each length, paged in each of `page_sizes` (None: contiguous)."""
    h, hkv, d = shape
    return [serving_step(h, d, parse_dtype(dtype), kv_heads=hkv, cache=n, page_size=p, mix=mix)
            for n, p in product(caches, page_sizes)]


#: (heads, kv_heads, head_dim) with H*D = 2048, and the GQA/MQA groupings
MHA_64, MHA_128, MHA_256 = (32, 32, 64), (16, 16, 128), (8, 8, 256)
GQA_32_8, MQA = (32, 8, 64), (16, 1, 128)
GPU_MASKS = ("window", "docs-causal", "keypad", "causal+keypad")


def _with(cases: list[AttentionCase], **modifiers) -> list[AttentionCase]:
    return [replace(c, **modifiers) for c in cases]


#: the attention of the models whose modifiers the GPU matrices run, at TOKENS tokens a batch: Gemma-2-9B's
#: global and local layers (softcap 50), gpt-oss-20b's full and window-128 layers (sinks), DeepSeek-V3's MLA
GEMMA_2, GPT_OSS, DEEPSEEK_V3 = (16, 8, 256), (64, 8, 64), (128, 128, 192)


def _gpu_model_cases(seqs) -> list[AttentionCase]:
    return (_with(_tokens(["bf16"], seqs, ["causal", "window4096"], [GEMMA_2]), softcap=50.0)
            + _with(_tokens(["bf16"], seqs, ["causal", "window128"], [GPT_OSS]), sinks=True)
            + _with(_tokens(["bf16"], seqs, ["causal"], [DEEPSEEK_V3]), head_dim_v=128)
            + _with(_tokens(["bf16"], seqs, ["causal"], [MHA_128]), alibi=True))


#: smoke's padded batch: element 0 is all padding (rows that see no key: output 0, gradient 0), element 1 20 of 33
SMOKE_PADDING = KeyPadding((0, 20))
#: 8 keys back bites on every row past the ninth (a window as long as the sequence hid an off-by-one)
SMOKE_WINDOW = SlidingWindow(8, 0)
#: smoke's long sequence: past 128 and no multiple of 16, 32, 64 or 128, so a tiled kernel that loses its last
#: partial block of keys fails (issue 67: at 64 tokens, a whole tile, it passed), in prefill and in a decode step
SMOKE_SEQ = 161


def _smoke() -> list[AttentionCase]:
    return (_cases(["fp32", "bf16"], [(SMOKE_SEQ, SMOKE_SEQ), (17, 33)], ["none", "causal"], [32])
            + [AttentionCase(2, 4, SMOKE_SEQ, 32, parse_dtype("fp32"), mask=SMOKE_WINDOW),
               AttentionCase(2, 4, SMOKE_SEQ, 32, parse_dtype("bf16"), kv_heads=2, mask=SMOKE_WINDOW)]
            + [AttentionCase(2, 4, 17, 32, parse_dtype(d), seq_k=33, mask=SMOKE_PADDING) for d in ("fp32", "bf16")]
            + [AttentionCase(2, 4, 1, 32, parse_dtype("bf16"), kv_heads=2, seq_k=SMOKE_SEQ, mask=CausalBottomRight())])


def _default() -> list[AttentionCase]:
    # Every verdict class once, in its most telling dtype: each case is a flex compile of ~5-9 s of one core (CPU,
    # torch 2.13), so classes share cases; docs/measurements.md has the coverage table and what went to `full`.
    square, odd = dict(batch=2, heads=4, seq_q=128, head_dim=64), dict(batch=2, heads=4, seq_q=113, head_dim=64)
    return (
        # every mask on a non-square shape; the other direction (Sq > Sk) where it has fully-masked rows
        _cases(["fp32"], [(113, 203)], CPU_MASKS, [64])
        + _cases(["fp32"], [(203, 113)], ["causal-br"], [64])
        + _cases(["bf16", "fp16"], [(128, 128)], ["causal"], [64])
        + _cases(["bf16"], [(129, 129)], ["causal"], [59, 256])
        + _cases(["fp32"], [(129, 129)], ["none"], [111])
        + _cases(["fp32"], [(1, 1), (1, 257)], ["causal-br"], [64])
        # sequence doubling, so memory growth (O(n^2) materialized vs O(n) fused) shows in one run
        + _cases(["fp32"], [(512, 512), (1024, 1024)], ["none"], [64])
        + _cases(["fp32"], [(127, 127)], ["causal"], [64], heads=((8, 2),))
        + _cases(["bf16"], [(127, 127)], ["causal"], [64], heads=((8, 1),))
        # one case per modifier and the combinations models use (flex compiles every new (shape, score_mod))
        + [AttentionCase(**square, dtype="bf16", mask=SlidingWindow(32, 0), softcap=50.0),          # Gemma local
           AttentionCase(2, 8, 127, 64, "fp32", kv_heads=2, mask=SlidingWindow(32, 0), sinks=True),  # gpt-oss
           AttentionCase(**odd, dtype="fp32", seq_k=203, mask=CausalBottomRight(), alibi=True),      # BLOOM/MPT
           AttentionCase(**square, dtype="bf16", mask=KeyPadding((96, 128)), bias="head"),           # T5-style
           AttentionCase(**odd, dtype="fp32", seq_k=203, bias="full"),
           AttentionCase(2, 4, 129, 192, "bf16", mask=Causal(), head_dim_v=128)]                     # DeepSeek MLA
        # paged KV: a decode step (fp32) and a 4-token verification (bf16) over shuffled pages of 16
        + _paged([200], [1], [16], dtype="fp32", shape=(8, 2, 64), batch=3)
        + _paged([200], [4], [16], shape=(8, 2, 64), batch=3)
        # mixed serving steps (a 24-token prefill chunk, 5 decodes, 2 verifications of 4): paged in bf16, and over
        # a contiguous cache in fp32, where the backward is judged too
        + _steps([96], [16], shape=(8, 2, 64), mix=CPU_MIX)
        + _steps([96], [None], dtype="fp32", shape=(8, 2, 64), mix=CPU_MIX)
        # FP8 (e4m3) KV caches (spec.fp8): a paged verification with per-head scales, a causal prefill per tensor
        + _with(_paged([200], [4], [16], shape=(8, 2, 64), batch=3), fp8_kv="head")
        + _with(_cases(["bf16"], [(113, 203)], ["causal-br"], [64], heads=((8, 2),)), fp8_kv="tensor")
    )


def _full() -> list[AttentionCase]:
    return (
        _default()
        # what `default` had until issue 33: the long cases (bf16 s1023, fp32 s2048: ~108 s of timed samples on 2
        # cores), the other direction of every mask, a dtype twin of each question, the head-dim sweep, tiny and
        # off-tile long sequences, and Gemma's global softcap
        + _cases(["fp32"], [(203, 113)], CPU_MASKS, [64])
        + _cases(["bf16"], [(128, 128)], CPU_MASKS, [64])
        + _cases(["fp16"], [(128, 128)], ["none"], [64])
        + _cases(["bf16"], [(129, 129)], ["causal"], [32, 40, 80, 96, 111, 128])
        + _cases(["fp32"], [(129, 129)], ["none"], [40])
        + _cases(["fp32"], [(17, 17), (1023, 1023)], ["causal-br"], [64])
        + _cases(["bf16"], [(1023, 1023)], ["none"], [64])
        + _cases(["fp32"], [(2048, 2048)], ["none"], [64])
        + _cases(["fp32"], [(127, 127)], ["causal"], [64], heads=((8, 1),))
        + _cases(["bf16"], [(127, 127)], ["causal"], [64], heads=((8, 2),))
        + [AttentionCase(2, 4, 128, 64, "fp32", mask=Causal(), softcap=30.0)]                # Gemma global
        + _cases(["fp32", "fp16", "bf16"], [(128, 128), (113, 203), (203, 113)], CPU_MASKS, [64])
        + _cases(["fp32", "bf16"], [(129, 129)], ["none", "causal"], [32, 40, 59, 80, 96, 111, 128, 256])
        + _cases(["fp32", "fp16", "bf16"], [(1, 239), (239, 1), (2, 2), (1025, 1025), (1023, 1024)],
                 CPU_MASKS, [64, 128])
        + _cases(["fp16", "bf16"], [(2048, 2048), (4096, 4096)], ["none", "causal"], [64, 128])
        + _cases(["fp32", "fp16", "bf16"], [(257, 257)], ["none", "causal", "window"],
                 [40, 59, 80, 96, 111, 160, 192, 224, 256])
        + _cases(["fp16", "bf16"], [(511, 1023)], CPU_MASKS, [128], heads=((8, 8), (8, 2), (8, 1)))
        # the real serving step (StepMix's default) at CPU head counts
        + _steps([2048], [16], shape=(8, 2, 64))
        # FP8 Q/K/V (FlashAttention-3's FP8 path) on the FP8 KV cases' shapes
        + _with(_paged([200], [4], [16], shape=(8, 2, 64), batch=3), fp8_kv="head", fp8_q=True)
        + _with(_cases(["bf16"], [(113, 203)], ["causal-br"], [64], heads=((8, 2),)), fp8_kv="tensor", fp8_q=True)
    )


def _gpu_smoke() -> list[AttentionCase]:
    # a minute or two on an H100: the main paths once each, and a little of the correctness slice
    return (_tokens(["bf16"], [1024, 4096], ["none", "causal"], [MHA_128])
            + _tokens(["fp16"], [4096], ["causal"], [MHA_128])
            + _tokens(["bf16"], [4096], ["causal"], [GQA_32_8])
            + _tokens(["bf16"], [4096], ["docs-causal"], [MHA_128])
            + _decode([8192])
            + _paged([8192], [1], [16, 256]) + _paged([8192], [4], [256])
            + _steps([4096], [16])
            + _with(_paged([8192], [1], [16]) + _steps([4096], [16]), fp8_kv="head")
            + _with(_paged([8192], [1], [16]), fp8_kv="head", fp8_q=True)
            + _cases(["bf16"], [(113, 203)], ["causal-br", "causal+keypad"], [64])
            + _cases(["fp16"], [(129, 129)], ["causal"], [80])
            + _gpu_model_cases([4096]))


def _gpu() -> list[AttentionCase]:
    # the GPU main job within 15 minutes of one H200 (fitted.run_estimate, 7 backends, 3 rounds: `selftest --dry-run`),
    # each question once; FP8 as a Q/K/V paged decode, which every FP8 kernel takes (FA3 only that way)
    return (_tokens(["bf16"], [1024, 4096, 16384], ["causal"], [MHA_128])
            + _tokens(["bf16"], [4096], ["docs-causal"], [MHA_128])
            + _tokens(["fp16"], [4096], ["causal"], [MHA_128])
            + _tokens(["bf16"], [2048], ["causal"], [GQA_32_8, MQA])
            + _decode([4096])
            # paged decode over pages of 16 is in the serving step (31 decodes) and in the FP8 case
            + _paged([4096], [4], [256])
            + _steps([2048], [16]) + _with(_paged([4096], [1], [16]), fp8_kv="head", fp8_q=True)
            + _with(_tokens(["bf16"], [4096], ["causal"], [GEMMA_2]), softcap=50.0)
            + _with(_tokens(["bf16"], [4096], ["window128"], [GPT_OSS]), sinks=True)
            + _cases(["bf16"], [(113, 203)], ["causal-br"], [64])
            + _cases(["fp16"], [(129, 129)], ["causal"], [59]))


def _gpu_wide() -> list[AttentionCase]:
    """What `gpu` held until issue 33 (~1 h 40 min on an H200 by fitted.run_estimate; ~1 h 50 min before issue 48)."""
    return (_tokens(["bf16"], [512, 1024, 2048, 4096, 8192, 16384], ["none", "causal"], [MHA_64, MHA_128])
            + _tokens(["fp16"], [1024, 4096, 16384], ["none", "causal"], [MHA_128])
            + _tokens(["bf16"], [1024, 4096, 16384], ["causal"], [MHA_256])
            + _tokens(["bf16"], [2048, 8192], ["causal"], [GQA_32_8, MQA])
            + _tokens(["bf16"], [4096, 16384], GPU_MASKS, [MHA_128])
            + _decode([1024, 4096, 16384, 65536, 131072])
            + _gpu_model_cases([4096, 16384])
            + _with(_cases(["bf16"], [(113, 203)], ["causal-br", "causal+keypad"], [64]), bias="head")
            + _paged([1024, 4096, 16384, 65536, 131072], [1], [16, 256])
            + _paged([4096, 32768], [4, 8], [16, 256])
            + _steps([4096, 32768], [16, 256])
            + _with(_paged([32768], [1, 4], [16, 256]) + _steps([4096, 32768], [16]), fp8_kv="head")
            + _with(_paged([32768], [1], [16]), fp8_kv="tensor")
            + _with(_paged([4096], [1], [16]), fp8_kv="head")                 # what `gpu` held until FP8 Q/K/V
            + _with(_paged([32768], [1], [16]) + _steps([4096], [16]), fp8_kv="tensor", fp8_q=True)
            # the CPU default matrix's odd sizes and edges in GPU dtypes, where kernels refuse or break, at no cost
            + _cases(["bf16"], [(113, 203), (203, 113)], CPU_MASKS + ("docs-causal",), [64])
            + _cases(["fp16"], [(129, 129)], ["causal"], [40, 59, 80, 111, 256])
            + _cases(["bf16"], [(1, 1), (1, 257), (17, 17), (1023, 1023)], ["causal-br"], [64])
            + _cases(["bf16", "fp16"], [(127, 127)], ["causal"], [64], heads=((8, 2), (8, 1))))


def _gpu_full() -> list[AttentionCase]:
    return (_gpu() + _gpu_wide()
            + _tokens(["bf16", "fp16"], [32768, 65536], ["none", "causal"], [MHA_128, MHA_64])
            + _tokens(["fp16"], [512, 2048, 8192], ["none", "causal"], [MHA_64, MHA_128])
            + _tokens(["bf16", "fp16"], [512, 2048, 8192, 32768], ["causal"], [MHA_256])
            + _tokens(["bf16", "fp16"], [1024, 4096, 16384, 32768], ["causal"], [GQA_32_8, MQA])
            + _tokens(["bf16", "fp16"], [1024, 8192, 32768], GPU_MASKS + ("docs",), [MHA_128, GQA_32_8])
            + _decode([1024, 4096, 16384, 65536, 131072], cached_tokens=524288)
            + _cases(["fp16"], [(1, 239), (239, 1), (2, 2), (1025, 1025), (1023, 1024)], CPU_MASKS, [64, 128])
            + _cases(["bf16"], [(257, 257)], ["none", "causal", "window"], [40, 59, 80, 96, 111, 160, 192, 256]))


#: how long a matrix runs, and so the probes' tier: "smoke" (minutes) runs no probes, "default" and "full" their own
RUNTIME_CLASSES = ("smoke", "default", "full")
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Matrix:
    """A named case matrix; docs/timing.md's matrix table lists exactly these (tests/unit/cases/test_matrices.py)."""

    name: str
    build: Callable[[], list[AttentionCase]]
    device: str
    runtime: str
    description: str

    def __post_init__(self):
        if self.device not in DEVICES or self.runtime not in RUNTIME_CLASSES:
            raise ValueError(f"matrix {self.name!r}: device={self.device!r} (allowed: {', '.join(DEVICES)}), "
                             f"runtime={self.runtime!r} (allowed: {', '.join(RUNTIME_CLASSES)})")


#: every named matrix, in the order the help and the docs list them
REGISTRY: dict[str, Matrix] = {m.name: m for m in (
    Matrix("smoke", _smoke, "cpu", "smoke",
           "fp32/bf16, two shapes (161 tokens: past 128, no whole tile), none/causal; in fp32 and bf16 a window "
           "that bites (8 keys of 161; bf16 with GQA 4/2 heads), a padded batch with a sequence that is all padding "
           "(rows that see no key) and a bf16 decode step over 161 keys"),
    Matrix("default", _default, "cpu", "default",
           "every verdict class once: every mask on a non-square shape, fp32/bf16/fp16, odd head dims, decode, GQA "
           "and MQA, seq 512 and 1024 for memory growth; 6 modifier cases ([variants.md](variants.md)), 2 paged "
           "decode/verification cases, 2 mixed serving steps and 2 FP8 KV-cache cases ([serving.md](serving.md))"),
    Matrix("full", _full, "cpu", "full", "every dtype × mask × shape, head dims 32–256, seq to 4096, one "
           "full-size mixed serving step, 2 FP8 Q/K/V cases"),
    Matrix("gpu-smoke", _gpu_smoke, "cuda", "smoke",
           "bf16/fp16 at 1k/4k, GQA, packed docs, one decode, two odd shapes; Gemma-2/gpt-oss/DeepSeek-V3/ALiBi "
           "model shapes; 3 paged cases, one mixed serving step, 2 FP8 KV-cache cases and an FP8 Q/K/V decode"),
    Matrix("gpu", _gpu, "cuda", "default",
           "bf16, 16k tokens a batch, seq 1k/4k/16k causal, packed docs at 4k, fp16, GQA 32/8 and MQA, decode and "
           "paged verification over 4k KV, a mixed serving step over 2k (pages of 16), an FP8 Q/K/V paged "
           "decode, Gemma-2 and gpt-oss modifiers, two odd sizes: within 15 min of an H200 by the cost model"),
    Matrix("gpu-full", _gpu_full, "cuda", "full",
           "`gpu` plus seq 512–64k, H·D = 2048 (d 64/128/256), more masks and GQA shapes, fp16 everywhere, decode "
           "and paged KV to 128k, mixed serving steps (a 512-token prefill chunk, 31 decodes, 4 verifications of 4; "
           "caches 4k/32k, pages 16/256), FP8 KV caches and FP8 Q/K/V (per head and per tensor), DeepSeek-V3 "
           "MLA, the CPU matrices' odd sizes"),
)}
MATRICES = tuple(REGISTRY)


def matrix(name: str) -> Matrix:
    """The registered matrix of that name (not 'auto': resolve_matrix first)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown matrix {name!r}; allowed: {', '.join(MATRICES)}")
    return REGISTRY[name]


def resolve_matrix(name: str, device_type: str) -> str:
    """'auto' -> the main job's matrix for the device ('gpu' on CUDA, 'default' elsewhere); others are checked."""
    if name == AUTO:
        device = "cuda" if device_type == "cuda" else "cpu"
        return next(m.name for m in REGISTRY.values() if m.device == device and m.runtime == "default")
    if name not in MATRICES and name != FUZZ:
        raise ValueError(f"unknown matrix {name!r}; allowed: {AUTO}, {', '.join(MATRICES)}, {FUZZ}")
    return name


def build_matrix(name: str) -> list[AttentionCase]:
    """The cases of a named matrix, de-duplicated, in a stable order."""
    return list(dict.fromkeys(matrix(name).build()))


CASE_SOURCES.append(lambda: [c for name in MATRICES for c in build_matrix(name)])
