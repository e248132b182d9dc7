"""Each backend's paged-KV translation checked against the spec (CacheCausal over a shuffled block table) on CPU."""

import warnings

import pytest
import torch

import harness
from harness import AttentionCase
from harness.spec.case import make_inputs
from harness.spec.masks import CacheCausal
from harness.spec.paged import paged_inputs, paged_layout
from harness.oracle.baseline import naive_attention

#: a decode step and a 4-token verification over caches of 45, 20 and 33 keys in pages of 16 (none a multiple)
DECODE = AttentionCase(3, 4, 1, 32, "fp32", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16)
VERIFY = AttentionCase(3, 4, 4, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16)


def test_gathering_backends_pass_paged_decode_and_verification_forward_only():
    df = harness.check(["naive", "sdpa", "sdpa-math"], [DECODE, VERIFY], "cpu")
    fwd, bwd = df[df.phase == "fwd"], df[df.phase == "bwd"]
    assert set(fwd.status) == {"pass"}, fwd[["case_id", "backend", "status", "reason"]]
    assert fwd.backend_op.str.contains("gather through the block table inside the timed call").all()
    assert set(bwd.status) == {"unsupported"} and bwd.reason.str.contains("forward-only").all()
    assert set(df.page_size) == {16}


def test_flex_paged_mask_mod_over_the_physical_cache_matches_the_spec():
    """The mask_mod flex gets for a paged case (attention-gym examples/paged_attention: physical -> logical page),
    run through torch 2.13's eager flex_attention on CPU (the compiled one is the suites' business)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from harness.backends.flex import paged_mask_mod, physical_kv

    case = VERIFY.__class__(3, 4, 4, 32, "fp32", kv_heads=2, seq_k=45, mask=VERIFY.mask, page_size=16)
    inputs = make_inputs(case)
    k_cache, v_cache, table, _ = paged_inputs(case, inputs.k, inputs.v)
    layout = paged_layout(case)
    mod = paged_mask_mod(case.mask, table, layout.num_blocks, 16, case.seq_q, case.seq_k)
    block_mask = create_block_mask(mod, 3, None, 4, layout.num_blocks * 16, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex warns that it is not compiled
        out = flex_attention(inputs.q, physical_kv(k_cache), physical_kv(v_cache), block_mask=block_mask,
                             scale=case.scale, enable_gqa=True)
    expected = naive_attention(inputs.q, inputs.k, inputs.v, case.mask, case.scale)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_backend_without_a_paged_path_is_unsupported_with_the_reason():
    df = harness.check(["xformers"], [DECODE], "cpu")
    assert set(df.status) <= {"unsupported", "unavailable"}


def test_unpaged_backend_reason_names_the_capability():
    class Plain(harness.Backend):
        name = "plain-test"

    reasons = Plain().can_run(DECODE, torch.device("cpu"))
    assert reasons == ["plain-test has no paged KV path (paged_kv=False)"]
