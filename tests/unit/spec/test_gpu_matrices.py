"""The GPU matrices (gpu-smoke, gpu, gpu-full), 'auto', and the CPU matrices left as they were."""

import pytest

from harness.spec.matrices import MATRICES, TOKENS, build_matrix, resolve_matrix


def test_cpu_matrices_are_unchanged():
    # the sizes before the GPU matrices existed (a newer mask name must not grow them)
    assert [len(build_matrix(m)) for m in ("smoke", "default", "full")] == [10, 42, 411]
    assert {c.mask_kind for c in build_matrix("default")} == {"none", "causal", "causal-br", "window", "keypad",
                                                               "causal+keypad"}


def test_auto_is_gpu_on_cuda_and_default_elsewhere():
    assert resolve_matrix("auto", "cuda") == "gpu" and resolve_matrix("auto", "cpu") == "default"
    assert resolve_matrix("gpu-smoke", "cpu") == "gpu-smoke"
    with pytest.raises(ValueError, match="unknown matrix 'huge'; allowed: auto, smoke"):
        resolve_matrix("huge", "cpu")


def _prefill(cases):
    """The token-budget cases: square, a power of two from 512 up (the correctness slice has 1023 and smaller)."""
    return [c for c in cases if c.seq_q == c.seq_k and c.seq_q >= 512 and c.seq_q & (c.seq_q - 1) == 0]


def test_gpu_matrix_is_what_the_field_benchmarks():
    cases = build_matrix("gpu")
    assert 60 <= len(cases) <= 90
    big = _prefill(cases)
    assert {str(c.dtype) for c in cases} == {"torch.bfloat16", "torch.float16"}          # no fp32 at all
    assert all(c.batch * c.seq_q == TOKENS for c in big)                                  # ~16k tokens a batch
    assert {c.seq_q for c in big} == {512, 1024, 2048, 4096, 8192, 16384}
    assert {(c.heads, c.head_dim) for c in big if c.kv_heads == c.heads} == {(32, 64), (16, 128), (8, 256)}
    assert {(c.heads, c.kv_heads) for c in big if c.kv_heads != c.heads} == {(32, 8), (16, 1)}   # GQA, MQA
    assert {c.mask_kind for c in big} == {"none", "causal", "window", "docs-causal", "keypad", "causal+keypad"}
    decode = [c for c in cases if c.seq_q == 1 and c.seq_k >= 1024]
    assert {c.seq_k for c in decode} == {1024, 4096, 16384, 65536, 131072}
    assert all(c.kv_heads == 8 and c.heads == 32 for c in decode)
    # the correctness slice keeps the CPU matrices' odd sizes and edges
    small = [c for c in cases if c not in big and c not in decode]
    assert {59, 111}.issubset({c.head_dim for c in small})
    assert {(113, 203), (203, 113), (1, 1), (1, 257), (17, 17)}.issubset({(c.seq_q, c.seq_k) for c in small})
    assert {"causal-br", "causal+keypad", "docs-causal"}.issubset({c.mask_kind for c in small})


def test_gpu_smoke_is_short_and_gpu_full_adds_long_sequences():
    smoke = build_matrix("gpu-smoke")
    assert len(smoke) <= 12 and {c.seq_q for c in _prefill(smoke)} == {1024, 4096}
    assert any(c.seq_q == 1 for c in smoke) and any(c.kv_heads != c.heads for c in smoke)
    full = build_matrix("gpu-full")
    assert set(build_matrix("gpu")).issubset(full)
    assert {32768, 65536}.issubset({c.seq_q for c in _prefill(full)})


@pytest.mark.parametrize("name", MATRICES)
def test_every_matrix_is_valid_and_unique(name):
    cases = build_matrix(name)
    assert len(cases) == len(set(cases)) == len({c.id for c in cases})
