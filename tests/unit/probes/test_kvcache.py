"""KV cache: the decode reference is the last row of full causal attention; planted cache-offset bugs fail."""

import pytest
import torch

from harness import AttentionCase, make_inputs
from harness.backends import get_backends
from harness.backends.naive import Naive
from harness.cases.case import Inputs
from harness.probes.kvcache import chunk_bounds, decode_rows, prefill_rows
from harness.cases.masks import Causal, CausalBottomRight
from harness.oracle.reference import reference_attention

CPU = torch.device("cpu")
CASE = AttentionCase(2, 4, 24, 16, "fp32", kv_heads=2, mask=Causal())


class TopLeftCache(Naive):
    """Forgets the cache offset: treats a bottom-right (cache) mask as top-left causal."""

    name = "top-left-cache"

    def forward(self, q, k, v, *, mask, scale):
        return super().forward(q, k, v, mask=Causal() if isinstance(mask, CausalBottomRight) else mask, scale=scale)


def statuses(rows):
    return {(r.case_id.split(":")[0] + ":" + r.case_id.split(":")[1] if r.case_id.startswith("prefill")
             else r.case_id.split(":")[0], r.phase): r.status for r in rows}


def test_decode_reference_is_last_row_of_full_causal_attention():
    inputs = make_inputs(CASE)
    full = reference_attention(CASE, inputs, grads=False).out
    decode = AttentionCase(2, 4, 1, 16, "fp32", kv_heads=2, seq_k=24, mask=CausalBottomRight())
    last = Inputs(inputs.q[:, :, -1:], inputs.k, inputs.v, inputs.d_out[:, :, -1:])
    assert torch.allclose(reference_attention(decode, last, grads=False).out, full[:, :, -1:], atol=1e-12)


@pytest.mark.parametrize("backend", get_backends("naive,sdpa-math,sdpa-flash"), ids=lambda b: b.name)
def test_cpu_backends_pass_decode_and_chunked_prefill(backend):
    rows = decode_rows(backend, CASE, CPU) + prefill_rows(backend, CASE, 3, CPU)
    assert {r.status for r in rows} == {"pass"}
    ids = {r.case_id for r in rows}
    assert "decode:fp32-b2-h4kv2-s1x24-d16-causal-br" in ids
    assert {"prefill:chunk3of3:fp32-b2-h4kv2-s8x24-d16-causal-br",
            "prefill:assembled3:fp32-b2-h4kv2-s24-d16-causal"} <= ids


def test_forgetting_the_cache_offset_fails_decode_and_later_chunks():
    rows = decode_rows(TopLeftCache(), CASE, CPU) + prefill_rows(TopLeftCache(), CASE, 2, CPU)
    got = statuses(rows)
    assert got[("decode", "fwd")] == "fail"
    assert got[("prefill:chunk1of2", "fwd")] == "pass"                 # no cache yet: top-left is right
    assert got[("prefill:chunk2of2", "fwd")] == "fail" and got[("prefill:assembled2", "fwd")] == "fail"


def test_chunk_bounds_cover_the_sequence():
    assert chunk_bounds(10, 3) == [(0, 3), (3, 7), (7, 10)]
    with pytest.raises(ValueError, match="chunks=11: must be between 1 and seq=10"):
        chunk_bounds(10, 11)


def test_kv_checks_want_a_square_causal_case():
    with pytest.raises(ValueError, match="square causal case"):
        decode_rows(Naive(), AttentionCase(1, 2, 4, 16, "fp32", seq_k=6, mask=Causal()), CPU)


def test_rows_name_the_kernel_the_worker_ran_under_isolation(tmp_path):
    """The kernel a row records comes back with the call's result (the plan names it where the call ran): under
    isolation the assembled prefill rows said the supervisor's idle backend's default name ('sdpa-math'), now the
    kernel the worker's plan ran ('sdpa:math'), as in process."""
    from harness.isolation.supervisor import IsolatedExecutor

    from harness.backends.sdpa import SdpaMath

    case = AttentionCase(1, 2, 8, 16, "fp32", mask=Causal())
    executor = IsolatedExecutor(CPU, modules=(), log_dir=str(tmp_path / "workers"))
    try:  # a fresh instance here, first: nothing in this process has called it
        isolated = prefill_rows(SdpaMath(), case, 2, CPU, executor=executor)
    finally:
        executor.close()
    in_process = prefill_rows(SdpaMath(), case, 2, CPU)
    for rows in (in_process, isolated):
        assert {r.status for r in rows} == {"pass"}
        assert {(r.case_id.split(":")[1], r.phase): r.backend_op for r in rows} == {
            (piece, phase): "sdpa:math" for piece in ("chunk1of2", "chunk2of2", "assembled2")
            for phase in ("fwd", "bwd")}
