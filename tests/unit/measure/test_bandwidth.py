"""The bandwidth roofline on synthetic numbers: bytes moved, the ridge point, and which ceiling judges a row."""

import math

import pytest
import torch

from harness import AttentionCase
from harness.measure.limits.bandwidth import bound, bytes_moved, copy_bandwidth_samples, roofline_columns, visible_keys
from harness.measure.limits.flops import attention_flops
from harness.measure.timing import TimingConfig
from harness.cases.masks import CacheCausal, Causal, CausalBottomRight, KeyPadding, SlidingWindow


def test_decode_bytes_count_kv_once_per_kv_head():
    case = AttentionCase(2, 8, 1, 64, "bf16", kv_heads=2, seq_k=100)
    q_and_o = 2 * (2 * 8 * 1 * 64 * 2)
    k_and_v = 2 * (2 * 2 * 100 * 64 * 2)          # two kv heads, not eight query heads
    assert bytes_moved(case) == q_and_o + k_and_v
    assert bytes_moved(case, "bwd") == 2 * bytes_moved(case)


@pytest.mark.parametrize("mask", [Causal(), CausalBottomRight(), SlidingWindow(5, 0), KeyPadding((7, 40)),
                                  Causal() & KeyPadding((3, 40)), None])
def test_visible_keys_from_intervals_equals_the_materialized_mask(mask):
    batch, sq, sk = 2, 17, 40
    dense = torch.ones(batch, 1, sq, sk, dtype=torch.bool) if mask is None else \
        mask.materialize(sq, sk, batch=batch).expand(batch, 1, sq, sk)
    assert visible_keys(mask, batch, sq, sk) == int(dense.any(2).sum())


def test_padding_hides_keys_from_the_traffic():
    case = AttentionCase(2, 4, 1, 32, "fp32", seq_k=64, mask=KeyPadding((10, 64)))
    assert bytes_moved(case) == 2 * 2 * 4 * 32 * 4 + 2 * (10 + 64) * 4 * 32 * 4


def test_a_mixed_step_moves_its_query_tokens_not_its_padding():
    """A 4-token chunk and a decode (q padded to 4 rows): Q and O count 5 token rows; keys 10 + 6 (each seen)."""
    case = AttentionCase(2, 4, 4, 32, "fp32", seq_k=10, mask=CacheCausal((10, 6), (4, 1)))
    assert case.query_tokens == 5
    assert bytes_moved(case) == 2 * 5 * 4 * 32 * 4 + 2 * (10 + 6) * 4 * 32 * 4


def test_an_fp8_cache_moves_one_byte_a_key_element():
    case = AttentionCase(2, 4, 1, 32, "bf16", seq_k=64, fp8_kv="head")
    assert bytes_moved(case) == 2 * 2 * 4 * 32 * 2 + 2 * (2 * 64) * 4 * 32 * 1


def test_fp8_queries_move_one_byte_an_element_the_output_two():
    case = AttentionCase(2, 4, 1, 32, "bf16", seq_k=64, fp8_kv="head", fp8_q=True)
    assert bytes_moved(case) == 2 * 4 * 32 * (1 + 2) + 2 * (2 * 64) * 4 * 32 * 1


def test_ridge_point_decides_the_bound():
    # ridge = 100 TFLOP/s / 1000 GB/s = 100 FLOP/byte
    assert bound(99e6, 1e6, 100.0, 1000.0) == "memory"
    assert bound(101e6, 1e6, 100.0, 1000.0) == "compute"
    assert bound(1.0, 1.0, None, 1000.0) is None


def test_decode_is_judged_against_bandwidth_not_the_matmul_peak():
    case = AttentionCase(4, 32, 1, 128, "bf16", kv_heads=8, seq_k=4096)
    flops, moved = attention_flops(case, "fwd"), bytes_moved(case)
    peak_tflops, peak_gbps = 1000.0, 4000.0
    honest_ms = moved / (0.8 * peak_gbps * 1e9) * 1e3            # 80 % of the copy bandwidth
    cols = roofline_columns(case, "fwd", flops, honest_ms, peak_tflops, peak_gbps)
    assert cols["bound"] == "memory" and math.isclose(cols["pct_of_bw_peak"], 80.0)
    assert not cols["suspicious"] and cols["why"] == ""
    # 150 % of the bandwidth: impossible, though its TFLOP/s is a tiny share of the matmul peak
    fast = roofline_columns(case, "fwd", flops, honest_ms * 0.8 / 1.5, peak_tflops, peak_gbps)
    assert fast["suspicious"] and "copy bandwidth" in fast["why"]
    assert flops / (honest_ms * 0.8 / 1.5 * 1e-3) / 1e12 < 0.05 * peak_tflops


def test_prefill_is_judged_against_the_matmul_peak():
    case = AttentionCase(1, 16, 4096, 128, "bf16", mask=Causal())
    flops, moved = attention_flops(case, "fwd"), bytes_moved(case)
    fast_ms = flops / (2 * 100.0 * 1e12) * 1e3                    # twice a 100 TFLOP/s peak
    cols = roofline_columns(case, "fwd", flops, fast_ms, 100.0, 4000.0)
    assert cols["bound"] == "compute" and cols["suspicious"] and "matmul peak" in cols["why"]
    assert cols["gbps"] == pytest.approx(moved / (fast_ms * 1e-3) / 1e9)


def test_copy_bandwidth_is_measured_and_positive():
    gbps = max(copy_bandwidth_samples(torch.device("cpu"), TimingConfig(warmup_ms=1, budget_ms=5, min_reps=2),
                                      nbytes=2 ** 20, samples=3))
    assert math.isfinite(gbps) and gbps > 0
