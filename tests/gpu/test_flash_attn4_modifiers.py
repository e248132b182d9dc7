"""flash-attn-4's ALiBi and bias score_mod on a real GPU, judged against the float64 reference: the CUTLASS DSL
operations (math.absi, aux-tensor loads through Int32 fragments, tanh) that the CPU test replaces by torch stand-ins
(tests/unit/backends/test_flash_attn4.py), with seq_q != seq_k (bottom-right ALiBi), GQA (pack_gqa), and the cap
folded in. Read against flash-attn-4 4.0.0b36."""

from __future__ import annotations

import pytest
import torch

from harness import AttentionCase, check
from harness.backends.flash_attn4 import BIAS_BACKWARD_REFUSAL, FlashAttn4
from harness.cases.masks import CausalBottomRight
from harness.store.schema import BWD, FWD, PASS, UNSUPPORTED

pytestmark = pytest.mark.cuda

CASES = [
    AttentionCase(2, 4, 96, 64, "bf16", kv_heads=2, seq_k=160, mask=CausalBottomRight(), alibi=True),
    AttentionCase(2, 4, 128, 64, "fp16", seq_k=200, alibi=True, softcap=8.0),
    AttentionCase(2, 4, 64, 64, "bf16", seq_k=96, bias="full"),
    AttentionCase(2, 4, 64, 128, "bf16", kv_heads=1, alibi=True, bias="head"),
]


def test_fa4_alibi_and_bias_score_mod_pass_and_the_bias_backward_is_refused():
    why = FlashAttn4().unavailable_reason(torch.device("cuda"))
    if why:
        pytest.skip(why)
    df = check(["flash-attn-4"], CASES, "cuda").set_index(["case_id", "phase"])
    for case in CASES:
        fwd, bwd = df.loc[(case.id, FWD)], df.loc[(case.id, BWD)]
        assert fwd.status == PASS, (case.id, fwd.reason)
        if case.bias is None:
            assert bwd.status == PASS, (case.id, bwd.reason)
        else:
            assert bwd.status == UNSUPPORTED and BIAS_BACKWARD_REFUSAL in bwd.reason, (case.id, bwd.reason)
