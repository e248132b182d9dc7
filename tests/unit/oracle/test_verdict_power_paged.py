"""The verdict must catch the paged-KV bugs the field has shipped and pass a correct paged plugin."""

import pytest

import harness
from harness import AttentionCase
from harness.cases.masks import CacheCausal

#: decode (fp32, GQA) and 4-token verification (bf16) over caches of 45, 20 and 33 keys in pages of 16: no length
#: a multiple of the page size, the second sequence much shorter than the longest
CASES = [AttentionCase(3, 4, 1, 32, "fp32", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16),
         AttentionCase(3, 4, 4, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16)]
BUGS = ["broken-paged-off-by-one-page", "broken-paged-logical-order", "broken-paged-last-page-to-end",
        "broken-paged-top-left", "broken-paged-ignores-seqlen"]


@pytest.fixture(scope="module")
def paged_plugins():
    from tests.fixtures import broken_paged
    return broken_paged


@pytest.mark.parametrize("name", BUGS)
def test_planted_paged_bug_fails(paged_plugins, name):
    df = harness.check([name], CASES, "cpu")
    fwd = df[df.phase == "fwd"]
    assert list(fwd.status) == ["fail"] * len(CASES), fwd[["case_id", "status", "reason"]]
    assert (fwd.out_err > fwd.out_tol).all()


def test_correct_paged_plugin_passes(paged_plugins):
    df = harness.check(["paged-correct"], CASES, "cpu")
    assert list(df[df.phase == "fwd"].status) == ["pass"] * len(CASES)
    assert set(df[df.phase == "bwd"].status) == {"unsupported"}
