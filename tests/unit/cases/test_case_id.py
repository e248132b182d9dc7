"""AttentionCase.from_id: every id the harness prints reads back to the same case; a malformed one is one line."""

import pytest
from hypothesis import given, settings, strategies as st

from harness.cases.case import AttentionCase, _catalog
from harness.cases.masks import And, CacheCausal, Causal, CausalBottomRight, Documents, KeyPadding, SlidingWindow
from harness.cases.matrices import MATRICES, build_matrix
from harness.cases.presets import PRESETS


def test_every_matrix_and_preset_case_reads_back_from_its_id_and_spelled_id():
    cases = [c for name in MATRICES for c in build_matrix(name)]
    cases += [c for shape in PRESETS.values() for c in shape.cases() + shape.quick_cases()]
    digests = [c for c in cases if "~" in c.id]
    assert digests, "the matrices have long cache masks whose id is a digest"
    for case in cases:
        assert AttentionCase.from_id(case.id) == case, case.id
        assert AttentionCase.from_id(case.spelled_id) == case, case.spelled_id
    assert all("~" not in c.spelled_id for c in digests)
    assert set(_catalog()) >= {c.id for c in digests}


@st.composite
def cases(draw) -> AttentionCase:
    """Cases over every id part: masks and their '+' combinations, modifiers, scale, paged, mixed steps, FP8."""
    batch, kv = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    heads, head_dim = kv * draw(st.integers(1, 5)), draw(st.integers(1, 300))
    dtype = draw(st.sampled_from(["fp32", "fp16", "bf16", "fp64"]))
    kind = draw(st.sampled_from(["plain", "paged", "mixed", "fp8"]))
    if kind in ("paged", "mixed"):
        lengths = tuple(draw(st.lists(st.integers(1, 300), min_size=batch, max_size=batch)))
        q_lens = tuple(draw(st.integers(1, n)) for n in lengths) if kind == "mixed" else None
        seq_q = max(q_lens) if q_lens else draw(st.integers(1, min(lengths)))
        page = draw(st.one_of(st.none(), st.integers(1, 64)))
        fp8 = draw(st.sampled_from([None, "tensor", "head"])) if dtype != "fp64" else None
        return AttentionCase(batch, heads, seq_q, head_dim, "bf16" if fp8 else dtype, kv_heads=kv,
                             seq_k=max(lengths), mask=CacheCausal(lengths, q_lens), page_size=page, fp8_kv=fp8,
                             fp8_q=bool(fp8) and draw(st.booleans()))
    seq_q, seq_k = draw(st.integers(1, 400)), draw(st.integers(1, 400))
    side = st.one_of(st.just(-1), st.integers(0, 500))
    parts = st.sampled_from([
        Causal(), CausalBottomRight(),
        SlidingWindow(draw(side), draw(side), scaled_from=draw(st.one_of(st.none(), st.integers(1, 9999)))),
        KeyPadding(tuple(draw(st.lists(st.integers(0, seq_k), min_size=batch, max_size=batch))))])
    mask = draw(st.one_of(st.none(), parts, st.tuples(parts, parts).filter(lambda p: type(p[0]) is not type(p[1]))
                          .map(lambda p: And(*p))))
    if draw(st.booleans()) and seq_q >= 2 and seq_k >= 2:
        cut_q, cut_k = draw(st.integers(0, seq_q)), draw(st.integers(0, seq_k))
        mask = Documents((cut_q, seq_q - cut_q), (cut_k, seq_k - cut_k), causal=draw(st.booleans()))
    if kind == "fp8" and dtype != "fp64":
        return AttentionCase(batch, heads, seq_q, head_dim, "bf16", kv_heads=kv, seq_k=seq_k, mask=mask,
                             fp8_kv=draw(st.sampled_from(["tensor", "head"])), fp8_q=draw(st.booleans()))
    number = st.floats(1e-4, 1e4, allow_nan=False, allow_infinity=False)
    return AttentionCase(batch, heads, seq_q, head_dim, dtype, kv_heads=kv, seq_k=seq_k, mask=mask,
                         scale=draw(st.one_of(st.none(), number)), softcap=draw(st.one_of(st.none(), number)),
                         sinks=draw(st.booleans()), alibi=draw(st.booleans()),
                         bias=draw(st.sampled_from([None, "head", "full"])),
                         head_dim_v=draw(st.one_of(st.none(), st.integers(1, 300))))


@settings(max_examples=300, deadline=None)
@given(cases())
def test_generated_cases_read_back_from_their_spelled_id(case):
    assert AttentionCase.from_id(case.spelled_id) == case
    if "~" not in case.id:
        assert case.id == case.spelled_id


@pytest.mark.parametrize("text, part", [
    ("fp33-b2-h4-s64-d32-none", "dtype at character 0"),
    ("fp32-b2-h4-s64-d32-causl", "mask at character 19"),
    ("fp32-b2-h4-s64-d32-causal-cap30-foo", "suffix at character 31"),
    ("fp32-b2-h4-s64-d32-window8-0-sink-cap3", "suffix"),                     # modifiers out of order
    ("fp32-bx-h4-s64-d32-none", "batch at character 4"),
    ("fp32-b2-h3kv2-s64-d32-none", "heads=3 is not a multiple of kv_heads=2"),
    ("fp32-b2-h4-s64-d32-keypad1", "KeyPadding.lengths=(1,) has 1 entries; batch is 2"),
    ("fp32-b6-h4-s5x9-d32-cache-causal6x5to9~0123abcd", "digest"),
    ("", "non-empty"),
])
def test_a_malformed_id_is_one_line_naming_its_part(text, part):
    with pytest.raises(ValueError) as err:
        AttentionCase.from_id(text)
    assert part in str(err.value) and "\n" not in str(err.value)
