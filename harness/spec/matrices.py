"""Named case matrices: smoke (seconds), default (a few minutes on 2 CPU cores), full (long)."""

from __future__ import annotations

from itertools import product

from harness.spec.case import AttentionCase, parse_dtype
from harness.spec.masks import MASK_NAMES, parse_mask

MATRICES = ("smoke", "default", "full")


def _cases(dtypes, shapes, masks, head_dims, heads=((4, 4),), batch=2) -> list[AttentionCase]:
    out = []
    for dtype, (sq, sk), mask, d, (h, hkv) in product(dtypes, shapes, masks, head_dims, heads):
        out.append(AttentionCase(batch, h, sq, d, parse_dtype(dtype), kv_heads=hkv, seq_k=sk,
                                 mask=parse_mask(mask, batch=batch, seq_k=sk)))
    return out


def build_matrix(name: str) -> list[AttentionCase]:
    """The cases of a named matrix, de-duplicated, in a stable order."""
    if name == "smoke":
        cases = _cases(["fp32", "bf16"], [(64, 64), (17, 33)], ["none", "causal"], [32])
    elif name == "default":
        # ~40 cases: flex compiles each distinct (shape, dtype, mask) for ~4 s on 2 CPU cores, so every
        # question is asked once, in the dtype where it is most telling, rather than in every dtype.
        cases = (
            # every mask on both non-square shapes (fp32) and on a square one (bf16)
            _cases(["fp32"], [(113, 203), (203, 113)], MASK_NAMES, [64])
            + _cases(["bf16"], [(128, 128)], MASK_NAMES, [64])
            + _cases(["fp16"], [(128, 128)], ["none", "causal"], [64])
            # head dims, odd ones included
            + _cases(["bf16"], [(129, 129)], ["causal"], [32, 40, 59, 80, 96, 111, 128, 256])
            + _cases(["fp32"], [(129, 129)], ["none"], [40, 111])
            # single-token queries (decode), tiny and off-tile long sequences
            + _cases(["fp32"], [(1, 1), (1, 257), (17, 17), (1023, 1023)], ["causal-br"], [64])
            + _cases(["bf16"], [(1023, 1023)], ["none"], [64])
            # sequence doubling, so memory growth (O(n^2) materialized vs O(n) fused) shows in one run
            + _cases(["fp32"], [(512, 512), (1024, 1024), (2048, 2048)], ["none"], [64])
            # GQA / MQA
            + _cases(["fp32", "bf16"], [(127, 127)], ["causal"], [64], heads=((8, 2), (8, 1)))
        )
    elif name == "full":
        cases = (
            build_matrix("default")
            + _cases(["fp32", "fp16", "bf16"], [(128, 128), (113, 203), (203, 113)], MASK_NAMES, [64])
            + _cases(["fp32", "bf16"], [(129, 129)], ["none", "causal"], [32, 40, 59, 80, 96, 111, 128, 256])
            + _cases(["fp32", "fp16", "bf16"], [(1, 239), (239, 1), (2, 2), (1025, 1025), (1023, 1024)],
                     MASK_NAMES, [64, 128])
            + _cases(["fp16", "bf16"], [(2048, 2048), (4096, 4096)], ["none", "causal"], [64, 128])
            + _cases(["fp32", "fp16", "bf16"], [(257, 257)], ["none", "causal", "window"],
                     [40, 59, 80, 96, 111, 160, 192, 224, 256])
            + _cases(["fp16", "bf16"], [(511, 1023)], MASK_NAMES, [128], heads=((8, 8), (8, 2), (8, 1)))
        )
    else:
        raise ValueError(f"unknown matrix {name!r}; allowed: {', '.join(MATRICES)}")
    return list(dict.fromkeys(cases))
