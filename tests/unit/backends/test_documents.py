"""Documents (packed, block-diagonal) mask: definition, validation, and every backend's translation on CPU."""

import pytest
import torch
import torch.nn.functional as F

from harness import AttentionCase, make_inputs
from harness.backends import get_backends
from harness.backends.base import Unsupported
from harness.backends.flash_attn import fa2_args
from tests.unit.backends.fa2_model import fa2_visible
from harness.backends.flex import flex_mask_mod
from harness.backends.sdpa import sdpa_mask_args
from harness.cases.masks import Documents
from harness.oracle.reference import reference_attention
from harness.run.runner import execute, prepare_case

DOCS = [
    Documents((2, 0, 1, 3)),
    Documents((2, 0, 1, 3), causal=True),
    Documents((1, 1, 1)),
    Documents((3, 2, 0, 1), (5, 0, 4, 1), causal=True),      # cross: doc 1 has queries and no keys
    Documents((3, 2, 0, 1), (5, 0, 4, 1)),
    Documents((0, 4), (2, 6), causal=True),
]


def grid(rows):
    return torch.tensor(rows, dtype=torch.bool)


def shape_of(mask):
    return sum(mask.q_lengths), sum(mask.k_lengths)


def test_causal_documents_with_empty_and_single_token_docs():
    expected = grid([[1, 0, 0, 0, 0, 0],
                     [1, 1, 0, 0, 0, 0],
                     [0, 0, 1, 0, 0, 0],      # a length-1 document sees itself only
                     [0, 0, 0, 1, 0, 0],
                     [0, 0, 0, 1, 1, 0],
                     [0, 0, 0, 1, 1, 1]])
    assert torch.equal(Documents((2, 0, 1, 3), causal=True).materialize(6, 6)[0, 0], expected)


def test_cross_documents_align_causal_bottom_right_within_each_document():
    # doc 0: 2 queries over 3 keys (query 0 sees keys 0-1); doc 1: no queries; doc 2: 1 query, 1 key
    expected = grid([[1, 1, 0, 0, 0, 0],
                     [1, 1, 1, 0, 0, 0],
                     [0, 0, 0, 0, 0, 1]])
    assert torch.equal(Documents((2, 0, 1), (3, 2, 1), causal=True).materialize(3, 6)[0, 0], expected)


def test_document_with_queries_and_no_keys_gives_empty_rows():
    m = Documents((3, 2, 0, 1), (5, 0, 4, 1)).materialize(6, 10)[0, 0]
    assert not m[3:5].any() and m[:3].any(-1).all() and m[5].any()


def test_rows_slice_equals_full():
    mask = Documents((3, 0, 1, 4), causal=True)
    assert torch.equal(mask.materialize(8, 8, rows=(2, 6)), mask.materialize(8, 8)[:, :, 2:6])


def test_id_names_lengths_and_causality():
    assert Documents((2, 0, 1)).id == "docs2_0_1"
    assert Documents((2, 0), (3, 1), causal=True).id == "docs-causal2_0x3_1"


@pytest.mark.parametrize("make, match", [
    (lambda: Documents(()), r"q_lengths=\(\)"),
    (lambda: Documents((2, -1)), r"q_lengths=\(2, -1\)"),
    (lambda: Documents((2, 1), (3,)), "same number of documents"),
    (lambda: Documents((2, 1), causal=1), "causal=1"),
    (lambda: AttentionCase(1, 1, 5, 8, "fp32", mask=Documents((2, 2))), "sum to 4 / 4; the case has seq_q=5"),
    (lambda: Documents((2, 2)).materialize(4, 5), "cover 4 queries x 4 keys; asked for 4 x 5"),
])
def test_invalid_documents_name_the_value(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("causal", [False, True])
def test_reference_equals_attention_of_each_document_alone(causal):
    # The packed mask means exactly this: every document attends within itself, independently.
    lengths = (3, 0, 1, 4)
    case = AttentionCase(1, 2, 8, 4, "fp64", mask=Documents(lengths, causal=causal))
    inputs = make_inputs(case)
    packed = reference_attention(case, inputs)
    start = 0
    for n in lengths:
        if n:
            doc = AttentionCase(1, 2, n, 4, "fp64", mask=None if not causal else Documents((n,), causal=True))
            part = inputs.map(lambda t: t[:, :, start:start + n])
            alone = reference_attention(doc, part)
            for packed_t, alone_t in zip(packed[:4], alone[:4]):
                assert torch.allclose(packed_t[:, :, start:start + n], alone_t, atol=1e-12)
        start += n


@pytest.mark.parametrize("mask", DOCS, ids=lambda m: m.id)
def test_fa2_varlen_documented_formula_equals_canonical(mask):
    sq, sk = shape_of(mask)
    args = fa2_args(mask, sq, sk)
    assert args["cu_seqlens_q"] == mask.starts("q") and args["cu_seqlens_k"] == mask.starts("k")
    assert torch.equal(fa2_visible(sq, sk, **args), mask.materialize(sq, sk))


@pytest.mark.parametrize("mask", DOCS, ids=lambda m: m.id)
def test_flex_mask_mod_equals_materialize(mask):
    sq, sk = shape_of(mask)
    mod = flex_mask_mod(mask, sq, sk)
    qi, ki = torch.arange(sq).view(1, 1, sq, 1), torch.arange(sk).view(1, 1, 1, sk)
    assert torch.equal(mod(torch.zeros(1, 1, 1, 1, dtype=torch.long), 0, qi, ki), mask.materialize(sq, sk))


@pytest.mark.parametrize("mask", DOCS, ids=lambda m: m.id)
def test_sdpa_dense_translation_behaves_like_mask(mask):
    sq, sk = shape_of(mask)
    case = AttentionCase(2, 2, sq, 4, "fp64", seq_k=sk, mask=mask)
    q, k, v, _ = make_inputs(case)[:4]
    ours = F.scaled_dot_product_attention(q, k, v, **sdpa_mask_args(mask, sq, sk, 2, "cpu"))
    assert torch.allclose(ours, reference_attention(case, make_inputs(case), grads=False).out, atol=1e-12)


@pytest.mark.parametrize("mask", DOCS, ids=lambda m: m.id)
def test_xformers_block_diagonal_materializes_to_canonical_per_batch(mask):
    pytest.importorskip("xformers.ops.fmha.attn_bias")
    from harness.backends.xformers import xformers_bias
    sq, sk = shape_of(mask)
    try:
        bias = xformers_bias(mask, (2, 3, sq, sk))
    except Unsupported as exc:
        # only bottom-right causal documents with fewer keys than queries, which xformers refuses
        assert mask.causal and any(nk < nq for nq, nk in zip(mask.q_lengths, mask.k_lengths)), exc
        return
    dense = torch.isfinite(bias.materialize((3, 2 * sq, 2 * sk), dtype=torch.float32))
    one = mask.materialize(sq, sk)[0, 0]
    assert torch.equal(dense, torch.block_diag(one, one).expand(3, 2 * sq, 2 * sk))


def test_xformers_names_the_refused_document_mask():
    pytest.importorskip("xformers.ops.fmha.attn_bias")
    from harness.backends.xformers import xformers_bias
    with pytest.raises(Unsupported, match="docs-causal3_2_0_1x5_0_4_1"):
        xformers_bias(Documents((3, 2, 0, 1), (5, 0, 4, 1), causal=True), (1, 1, 6, 10))


@pytest.mark.parametrize("backend", get_backends("sdpa-math,sdpa-flash"), ids=lambda b: b.name)
def test_cpu_backends_pass_documents_end_to_end(backend):
    case = AttentionCase(2, 2, 12, 16, "fp32", seq_k=14, mask=Documents((3, 2, 0, 1, 6), (5, 0, 2, 1, 6), causal=True))
    result = execute(backend, prepare_case(case, torch.device("cpu")))
    assert result.status == "pass", result.reasons
