"""FP8 Q/K/V and FlashAttention-3's contiguous path on a real CUDA device (the CPU counterparts:
tests/unit/backends/test_flash_attn3.py, tests/unit/oracle/test_verdict_power_fp8.py): every backend passes, is
unavailable here, or refuses with its reason - never fails. On an H200 (2026-12-04) the four FP8 Q/K/V cases passed
(FlashAttention-3 and -4 not installed: the contiguous FA3 cases skipped)."""

from __future__ import annotations

import pytest
import torch

from harness import AttentionCase, check
from harness.cases.case import paged_case
from harness.cases.masks import Causal, CausalBottomRight, SlidingWindow

pytestmark = pytest.mark.cuda
FP8 = ["naive", "sdpa", "flex", "flash-attn-3", "flashinfer", "flash-attn-4", "xformers", "flash-attn"]
QKV = [paged_case(4, 32, 1, 128, torch.bfloat16, kv_heads=8, cache=4096, page_size=16, fp8_kv="head", fp8_q=True),
       paged_case(4, 32, 4, 128, torch.bfloat16, kv_heads=8, cache=4096, page_size=256, fp8_kv="tensor",
                  fp8_q=True),
       AttentionCase(2, 16, 1024, 128, "bf16", kv_heads=4, mask=Causal(), fp8_kv="head", fp8_q=True),
       AttentionCase(2, 16, 333, 128, "bf16", kv_heads=4, seq_k=1000, mask=CausalBottomRight(), fp8_kv="tensor",
                     fp8_q=True)]


@pytest.mark.parametrize("case", QKV, ids=lambda c: c.id)
def test_fp8_qkv_passes_or_says_why(case):
    df = check(FP8, [case], "cuda")
    fwd = df[df.phase == "fwd"].set_index("backend")
    assert not set(fwd.status) & {"fail", "error"}, fwd[["status", "reason"]]
    assert fwd.loc["naive"].status == fwd.loc["sdpa"].status == "pass"
    assert fwd.loc["flash-attn-3"].status in ("pass", "unavailable"), fwd.loc["flash-attn-3"].reason
    refused = fwd[fwd.status == "unsupported"]
    # those that take no FP8 q refuse it, where they are installed (an H200 of 2026-12-04 had no flash-attn-4)
    no_fp8_q = {name for name in ("flashinfer", "flash-attn-4") if fwd.loc[name].status != "unavailable"}
    assert refused.reason.str.len().gt(0).all() and set(refused.index) >= no_fp8_q, refused.reason


@pytest.mark.parametrize("case", [
    AttentionCase(2, 16, 1024, 128, "bf16", kv_heads=4, mask=Causal()),
    AttentionCase(2, 16, 333, 64, "fp16", seq_k=1000, mask=CausalBottomRight()),
    AttentionCase(2, 16, 1024, 128, "bf16", mask=SlidingWindow(127, 0)),
    AttentionCase(2, 16, 1024, 256, "bf16", kv_heads=8, mask=Causal(), softcap=50.0),
    AttentionCase(2, 16, 512, 192, "bf16", head_dim_v=128, mask=Causal()),
], ids=lambda c: c.id)
def test_fa3_contiguous_passes_forward_and_backward(case):
    df = check(["flash-attn-3"], [case], "cuda")
    if set(df.status) == {"unavailable"}:
        pytest.skip(df.reason.iloc[0])
    rows = df.set_index("phase")
    assert rows.loc["fwd"].status == "pass", rows.loc["fwd"].reason
    if case.head_dim_v != case.head_dim:  # flash_api.cpp mha_bwd takes no hdim_v != hdim
        assert rows.loc["bwd"].status == "unsupported" and "V head dim" in rows.loc["bwd"].reason
    else:
        assert rows.loc["bwd"].status == "pass", rows.loc["bwd"].reason
