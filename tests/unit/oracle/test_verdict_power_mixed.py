"""The verdict must catch the bugs of mixed serving steps (prefill chunks, decodes and verifications in one paged
batch, each sequence with its own query and cache length) and pass a correct plugin (tests/fixtures/broken_mixed.py)."""

import pytest

import harness
from harness import AttentionCase
from harness.cases.masks import CacheCausal

#: a 12-token prefill chunk, two decodes and a 4-token verification over caches of 45, 20, 33 and 27 keys in pages of
#: 16 (no length a multiple of the page size; the first cache the longest, so one length for all reads stale keys),
#: in fp32 and bf16
LENGTHS, Q_LENS = (45, 20, 33, 27), (12, 1, 4, 1)
CASES = [AttentionCase(4, 4, 12, 32, dtype, kv_heads=2, seq_k=45, mask=CacheCausal(LENGTHS, Q_LENS), page_size=16)
         for dtype in ("fp32", "bf16")]
BUGS = ["broken-mixed-top-left", "broken-mixed-query-offset", "broken-mixed-decode-as-prefill",
        "broken-mixed-one-cache-length", "broken-mixed-reads-past-length"]


@pytest.fixture(scope="module")
def mixed_plugins():
    from tests.fixtures import broken_mixed
    return broken_mixed


@pytest.mark.parametrize("name", BUGS)
def test_planted_mixed_step_bug_fails(mixed_plugins, name):
    df = harness.check([name], CASES, "cpu")
    fwd = df[df.phase == "fwd"]
    assert list(fwd.status) == ["fail"] * len(CASES), fwd[["case_id", "status", "reason"]]
    assert (fwd.out_err > fwd.out_tol).all()


def test_correct_mixed_plugin_passes_and_the_step_is_forward_only(mixed_plugins):
    df = harness.check(["mixed-correct"], CASES, "cpu")
    assert list(df[df.phase == "fwd"].status) == ["pass"] * len(CASES)
    assert set(df[df.phase == "bwd"].status) == {"unsupported"}


def test_a_paged_plugin_without_mixed_batch_is_refused_with_the_reason(mixed_plugins):
    """A plugin written for one query length (tests/fixtures/broken_paged.py's correct one) is never called on a mixed
    step: it would read the padded seq_q as every sequence's query count."""
    from tests.fixtures import broken_paged  # noqa: F401 - registers paged-correct

    df = harness.check(["paged-correct"], CASES[:1], "cpu")
    assert set(df.status) == {"unsupported"}
    assert "takes no mixed serving step (per-sequence query lengths; mixed_batch=False)" in df.reason.iloc[0]
