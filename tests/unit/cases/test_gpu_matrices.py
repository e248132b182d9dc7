"""The GPU matrices (gpu-smoke, gpu, gpu-full), 'auto', and the CPU matrices left as they were."""

import pytest

from harness.cases.matrices import MATRICES, TOKENS, _gpu_wide, build_matrix, resolve_matrix


def _plain(cases):
    return [c for c in cases if not c.modifiers and c.head_dim_v == c.head_dim]


def test_cpu_matrices_sizes_and_what_default_keeps():
    # full as before (a newer mask name must not grow it) plus one full-size mixed serving step (issue 36); smoke's
    # windows that bite and all-padding sequences (issue 34); default sized down in issue 33 to every verdict class
    # once (docs/measurements.md's coverage table), what it dropped kept by full, then the mixed serving steps and
    # FP8 KV caches (issue 36); smoke's decode step over its long sequence (issue 67)
    assert [len(build_matrix(m)) for m in ("smoke", "default", "full")] == [13, 30, 427]
    # FP8 Q/K/V cases in full only (issue 36): per kv-head group paged, per tensor contiguous; none in smoke/default
    assert {(c.fp8_kv, c.page_size) for c in build_matrix("full") if c.fp8_q} == {("head", 16), ("tensor", None)}
    assert not any(c.fp8_q for m in ("smoke", "default") for c in build_matrix(m))
    default = build_matrix("default")
    assert set(default) <= set(build_matrix("full"))
    assert {c.mask_kind for c in default} == {"none", "causal", "causal-br", "window", "keypad", "causal+keypad",
                                              "cache-causal"}
    assert {str(c.dtype) for c in default} == {"torch.float32", "torch.bfloat16", "torch.float16"}
    assert [c.seq_q for c in default if c.page_size and not c.mask.mixed and not c.fp8_kv] == [1, 4]
    assert [c.fp8_kv for c in default if c.fp8_kv] == ["head", "tensor"]
    steps = [c for c in default if c.mask_kind == "cache-causal" and c.mask.mixed and not c.fp8_kv]
    assert [(c.page_size, c.mask.q_lens) for c in steps] == [(16, (24,) + (1,) * 5 + (4, 4)),
                                                             (None, (24,) + (1,) * 5 + (4, 4))]
    modified = [c for c in default if c not in _plain(default)]
    assert {c.modifier_id for c in modified} == {"cap50", "sink", "alibi", "headbias", "fullbias", "none"}
    assert any(c.head_dim_v != c.head_dim for c in modified)
    plain = _plain(default)
    assert {c.kv_heads for c in plain if c.kv_heads != c.heads} == {2, 1}                   # GQA and MQA
    assert any(c.seq_q == 1 and not c.page_size for c in plain)                              # decode
    assert any(c.seq_q < c.seq_k for c in plain) and any(c.seq_q > c.seq_k for c in plain)  # both directions
    assert {59, 111, 256} <= {c.head_dim for c in plain}                                      # odd and largest
    # memory growth: one mask, dtype and head dim at a sequence and its double
    assert {(512, 512), (1024, 1024)} <= {(c.seq_q, c.seq_k) for c in plain if c.mask_kind == "none"}


def test_gpu_matrices_run_the_models_modifiers():
    for name in ("gpu-smoke", "gpu-full"):
        shapes = {(c.heads, c.kv_heads, c.head_dim, c.head_dim_v, c.mask_id, c.modifier_id)
                  for c in build_matrix(name) if c.seq_q == 4096}
        assert {(16, 8, 256, 256, "causal", "cap50"), (16, 8, 256, 256, "window4096-0", "cap50"),
                (64, 8, 64, 64, "causal", "sink"), (64, 8, 64, 64, "window128-0", "sink"),
                (128, 128, 192, 128, "causal", "none")}.issubset(shapes), name


def test_auto_is_gpu_on_cuda_and_default_elsewhere():
    assert resolve_matrix("auto", "cuda") == "gpu" and resolve_matrix("auto", "cpu") == "default"
    assert resolve_matrix("gpu-smoke", "cpu") == "gpu-smoke"
    with pytest.raises(ValueError, match="unknown matrix 'huge'; allowed: auto, smoke"):
        resolve_matrix("huge", "cpu")


def _prefill(cases):
    """The token-budget cases: square, a power of two from 512 up (the correctness slice has 1023 and smaller)."""
    return [c for c in cases if c.seq_q == c.seq_k and c.seq_q >= 512 and c.seq_q & (c.seq_q - 1) == 0]


def _wide():
    """The sweep `gpu` held until issue 33, now in gpu-full."""
    return list(dict.fromkeys(_gpu_wide()))


def test_gpu_full_sweeps_what_the_field_benchmarks():
    cases = [c for c in _plain(_wide()) if c.page_size is None]   # the paged: test_gpu_paged_cases
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


def test_gpu_paged_cases_decode_and_verify_over_pages_of_16_and_256():
    paged = [c for c in _wide() if c.page_size is not None and not c.mask.mixed and not c.fp8_kv]
    assert {c.page_size for c in paged} == {16, 256} and {c.seq_q for c in paged} == {1, 4, 8}
    decode = [c for c in paged if c.seq_q == 1]
    assert sorted({c.seq_k + 1 for c in decode}) == [1024, 4096, 16384, 65536, 131072]   # odd lengths: partial pages
    assert all(n % c.page_size for c in paged for n in c.mask.lengths)
    assert all((c.heads, c.kv_heads, c.head_dim) == (32, 8, 128) for c in paged)
    smoke = [c for c in build_matrix("gpu-smoke") if c.page_size is not None and not c.mask.mixed and not c.fp8_kv]
    assert {(c.seq_q, c.page_size) for c in smoke} == {(1, 16), (1, 256), (4, 256)}


def test_gpu_serving_steps_are_the_real_mix():
    """One 512-token prefill chunk, 31 decodes and 4 verifications of 4 tokens over caches of 4k (gpu-smoke: pages
    of 16, and gpu: the one step its 15 minutes hold) and 4k/32k (gpu-full: pages 16 and 256), at Llama-3-8B's
    heads."""
    for name, expected in (("gpu-smoke", {(4095, 16)}), ("gpu", {(2047, 16)}),
                           ("gpu-full", {(2047, 16)} | {(n, p) for n in (4095, 32767) for p in (16, 256)})):
        steps = [c for c in build_matrix(name) if c.mask_kind == "cache-causal" and c.mask.mixed and not c.fp8_kv]
        assert {(c.seq_k, c.page_size) for c in steps} == expected, name
        for c in steps:
            assert c.mask.q_lens == (512,) + (1,) * 31 + (4,) * 4 and c.seq_q == 512 and c.batch == 36
            assert (c.heads, c.kv_heads, c.head_dim) == (32, 8, 128)
            assert all(n % c.page_size for n in c.mask.lengths)


def test_gpu_fp8_kv_cases_cover_decode_verification_and_steps_per_head_and_per_tensor():
    fp8 = [c for c in build_matrix("gpu-full") if c.fp8_kv]
    assert {c.fp8_kv for c in fp8} == {"head", "tensor"} and {c.seq_q for c in fp8} == {1, 4, 512}
    assert {c.page_size for c in fp8} == {16, 256} and all(c.dtype.itemsize == 2 for c in fp8)
    assert {c.fp8_kv for c in build_matrix("gpu-smoke") if c.fp8_kv} == {"head"}
    # FP8 Q/K/V: gpu's paged decode per kv-head group, gpu-full's per tensor decode and serving step too
    qkv = {(c.fp8_kv, c.seq_q) for c in build_matrix("gpu-full") if c.fp8_q}
    assert qkv == {("head", 1), ("tensor", 1), ("tensor", 512)}
    assert [(c.fp8_kv, c.seq_q) for c in build_matrix("gpu") if c.fp8_kv] == [("head", 1)]
    assert all(c.fp8_q for c in build_matrix("gpu") if c.fp8_kv)


def test_gpu_smoke_is_short_and_gpu_full_adds_long_sequences():
    smoke = [c for c in _plain(build_matrix("gpu-smoke")) if c.page_size is None]
    assert len(smoke) <= 12 and {c.seq_q for c in _prefill(smoke)} == {1024, 4096}
    assert any(c.seq_q == 1 for c in smoke) and any(c.kv_heads != c.heads for c in smoke)
    full = build_matrix("gpu-full")
    assert set(build_matrix("gpu")).issubset(full)
    assert {32768, 65536}.issubset({c.seq_q for c in _prefill(full)})


@pytest.mark.parametrize("name", MATRICES)
def test_every_matrix_is_valid_and_unique(name):
    cases = build_matrix(name)
    assert len(cases) == len(set(cases)) == len({c.id for c in cases})


def test_the_gpu_main_job_fits_15_minutes_of_an_h200_and_gpu_full_keeps_the_rest():
    """issue 33: the cost model's estimate of `gpu` at the H200's measured rates (7 backends, 3 rounds) is at most
    15 minutes; every case `gpu` held before is in gpu-full (307 cases, as before, and the 13 serving steps and FP8
    KV-cache cases of issue 36, and its 3 FP8 Q/K/V cases)."""
    from harness.planning.fitted import run_estimate

    gpu, full = build_matrix("gpu"), build_matrix("gpu-full")
    assert run_estimate(gpu) <= 15 * 60 < run_estimate(full)
    assert set(gpu) <= set(full) and len(full) == 323
    assert {c.mask_kind for c in gpu} >= {"none", "causal", "docs-causal", "cache-causal"}
    assert {c.seq_q for c in gpu if c.mask_kind == "causal" and not c.modifiers} >= {1024, 4096, 16384}
