"""The paged-KV path on a real CUDA device: every installed paged backend's verdict on decode and verification over
pages of 16 and 256, and the copy bandwidth the memory roofline is measured against (the CPU counterparts:
tests/unit/backends/test_paged_translations.py, tests/unit/measure/test_bandwidth.py). Not yet run on a GPU."""

from __future__ import annotations

import pytest
import torch

from harness import check
from harness.measure.bandwidth import copy_bandwidth_gbps
from harness.spec.case import paged_case

pytestmark = pytest.mark.cuda
PAGED = ["naive", "sdpa", "flex", "flash-attn", "xformers", "flashinfer"]


@pytest.mark.parametrize("page", [16, 256])
@pytest.mark.parametrize("seq_q", [1, 4])
def test_paged_backends_pass_or_say_why(seq_q, page):
    case = paged_case(4, 32, seq_q, 128, torch.bfloat16, kv_heads=8, cache=4096, page_size=page)
    df = check(PAGED, [case], "cuda")
    fwd = df[df.phase == "fwd"].set_index("backend")
    assert not set(fwd.status) & {"fail", "error"}, fwd[["status", "reason"]]
    assert fwd.loc["naive"].status == "pass" and fwd.loc["sdpa"].status == "pass"
    if page == 16:
        assert fwd.loc["flash-attn"].status in ("unsupported", "unavailable")


def test_copy_bandwidth_is_plausible_for_the_device():
    gbps = copy_bandwidth_gbps(torch.device("cuda"))
    assert 100 < gbps < 20_000  # an H200 counts ~4.3 TB/s read + write
