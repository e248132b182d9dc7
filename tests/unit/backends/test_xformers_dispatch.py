"""xformers' own op dispatcher, run on the CPU as it would answer on an sm90 (H100/H200) GPU: for every case the
xformers backend claims to run with gradients, a forward and a backward op exist.

Checked against xformers 0.0.35 (ops/fmha/dispatch.py `_dispatch_fw`/`_dispatch_bw`, ops/fmha/common.py
`AttentionOpBase.not_supported_reasons`): the dispatcher is plain Python; it reads torch.version.cuda (dispatch.py
lines 89 and 152), the device capability (common.py 460, 492), `common._built_with_cuda` (common.py 453-458), each
op's OPERATOR through `is_available` (ops/common.py 33-40), and the query's `device.type` (common.py 449). q, k and
v here are meta tensors of a subclass whose `.device` says cuda:0; the patches below make the rest say "sm90,
CUDA 12.8, extension built, torch's bundled flash"."""

import contextlib
from unittest import mock

import pytest
import torch

xformers_fmha = pytest.importorskip("xformers.ops.fmha")

from harness.backends.xformers import xformers_plan  # noqa: E402
from harness.probes.edge_cases import edge_cases  # noqa: E402
from harness.cases.case import AttentionCase  # noqa: E402
from harness.cases.masks import Causal, Documents, KeyPadding  # noqa: E402
from harness.cases.matrices import build_matrix  # noqa: E402

CPU = torch.device("cpu")


class CudaLooking(torch.Tensor):
    """A tensor whose `.device` reports cuda:0 while its data stays on meta; views keep the subclass."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def cuda_tensor(shape, dtype, device):
    return torch.empty(shape, dtype=dtype, device="meta").as_subclass(CudaLooking)


def _stub_kernel(*args, **kwargs):  # any callable not named no_such_operator counts as built
    raise RuntimeError("dispatch-only stub")


@contextlib.contextmanager
def sm90(bundled_flash: bool = True):
    """bundled_flash=False: fa2 from the flash_attn package instead (xformers then keeps the paged masks)."""
    from xformers.ops.fmha import attn_bias as ab, common, flash

    patch = mock.patch.object
    with contextlib.ExitStack() as stack:
        stack.enter_context(patch(torch.version, "cuda", "12.8"))
        stack.enter_context(patch(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0)))
        stack.enter_context(patch(common, "_built_with_cuda", True))
        for op in (flash.FwOp, flash.BwOp):
            stack.enter_context(patch(op, "OPERATOR", _stub_kernel))
        # fa2 from torch's bundled flash (no flash_attn package): xformers then drops the paged masks (flash.py 589)
        stack.enter_context(patch(flash, "_USE_PT_FLASH_ATTN", bundled_flash))
        stack.enter_context(patch(flash.FwOp, "SUPPORTED_ATTN_BIAS_TYPES",
                                  [b for b in flash.FwOp.SUPPORTED_ATTN_BIAS_TYPES
                                   if not (bundled_flash and issubclass(b, ab.PagedBlockDiagonalPaddedKeysMask))]))
        yield


def _cases() -> list[AttentionCase]:
    """Every case a run can give xformers: the matrices, the edge cases, and documents in each dtype."""
    cases = build_matrix("default") + build_matrix("full") + [e.case for e in edge_cases("full")]
    cases += [AttentionCase(2, 8, 300, d, dt, kv_heads=kv, mask=Documents((1, 0, 128, 44, 0, 127), causal=c))
              for dt in ("fp16", "bf16") for d in (64, 128) for kv in (2, 8) for c in (False, True)]
    return list(dict.fromkeys(cases))


def _names(op) -> str:
    """'fa2F@2.5.7-pt' -> 'fa2F', 'cutlassF-pt' -> 'cutlassF': the op, without its version and source."""
    return op.NAME.split("@")[0].removesuffix("-pt")


def test_every_case_claimed_with_gradients_has_a_forward_and_a_backward_op():
    claimed = refused = 0
    with sm90():
        for case in _cases():
            try:
                plan = xformers_plan(case, CPU, cuda_tensor)
            except Exception as exc:  # the backend says it cannot run the case at all: fine, with a reason
                assert str(exc), case.id
                refused += 1
                continue
            assert plan.inference.fw is not None, case.id
            assert plan.training is not None, f"{case.id}: {plan.backward_refused}"
            assert plan.training.fw is not None and plan.training.bw is not None, case.id
            assert not plan.training.bw.not_supported_reasons(_inputs(case, plan.training)), case.id
            claimed += 1
    assert claimed > 250 and refused < claimed  # the check covered the matrices, not a handful


def _inputs(case, form):
    """The training form's dispatch inputs again, to ask the chosen backward op itself."""
    from xformers.ops import fmha

    b, h, hkv, sq, sk, d = case.batch, case.heads, case.kv_heads, case.seq_q, case.seq_k, case.head_dim
    q = cuda_tensor((b, sq, h, d), case.dtype, CPU)
    k = cuda_tensor((b, sk, hkv, d), case.dtype, CPU).repeat_interleave(h // hkv, dim=2)
    v = cuda_tensor((b, sk, hkv, case.head_dim_v), case.dtype, CPU).repeat_interleave(h // hkv, dim=2)
    if form.packed:
        q, k, v = (t.reshape(1, -1, *t.shape[2:]) for t in (q, k, v))
    return fmha.Inputs(query=q, key=k, value=v, attn_bias=form.bias, scale=case.scale)


def test_gqa_runs_5d_for_inference_and_expanded_k_v_for_training():
    case = AttentionCase(2, 8, 127, 64, "bf16", kv_heads=2, mask=Causal())
    with sm90():
        plan = xformers_plan(case, CPU, cuda_tensor)
    assert plan.inference.gqa == "5d" and _names(plan.inference.fw) == "fa2F"
    assert plan.training.gqa == "expand" and (_names(plan.training.fw), _names(plan.training.bw)) == ("fa2F", "fa2B")


def test_the_plan_names_the_kernels_of_a_call_with_and_without_gradients():
    """The row's backend_op comes from the plan (Plan.ops), wherever the call ran: the inference form's forward op
    without gradients, the training form's forward and backward ops with them."""
    case = AttentionCase(2, 8, 127, 64, "bf16", kv_heads=2, mask=Causal())
    with sm90():
        plan = xformers_plan(case, CPU, cuda_tensor)
        inference, training = plan.ops(training=False), plan.ops(training=True)
    assert inference[0].startswith("xformers:fa2F") and inference[0].endswith("(GQA as 5-D, forward only)")
    assert training[0].startswith("xformers:fa2F") and training[0].endswith("(GQA with K/V expanded to every head)")
    assert training[1].startswith("xformers:fa2B") and plan.op == inference[0]


def test_the_5d_gqa_form_has_no_backward_op_which_is_why_training_expands():
    """The reviewed defect: with 5-D inputs and gradients, the forward call itself raised (xformers chooses the
    backward op during the forward; fa3B, fa2B and cutlassB have SUPPORTS_BMGHK=False)."""
    from xformers.ops.fmha import dispatch

    q = cuda_tensor((2, 127, 2, 4, 64), torch.bfloat16, CPU)
    k = cuda_tensor((2, 127, 2, 1, 64), torch.bfloat16, CPU).expand(2, 127, 2, 4, 64)
    with sm90(), pytest.raises(NotImplementedError, match="BMGHK"):
        dispatch._dispatch_bw(xformers_fmha.Inputs(query=q, key=k, value=k), varlen_lse_packed=None)


def test_causal_with_key_padding_trains_through_a_tensor_bias():
    """LowerTriangularMaskWithTensorBias is cutlassF-only (cutlass.py 180; commented out in cutlassB, 347-348): the
    backend folds causal and padding into one additive bias, which cutlassF and cutlassB both take."""
    from xformers.ops.fmha import attn_bias as ab, dispatch

    case = AttentionCase(2, 4, 129, 64, "fp16", mask=Causal() & KeyPadding((100, 129)))
    with sm90():
        plan = xformers_plan(case, CPU, cuda_tensor)
        assert isinstance(plan.training.bias, torch.Tensor)
        assert (_names(plan.training.fw), _names(plan.training.bw)) == ("cutlassF", "cutlassB")
        q = cuda_tensor((2, 129, 4, 64), torch.float16, CPU)
        typed = ab.LowerTriangularMaskWithTensorBias(plan.training.bias)
        with pytest.raises(NotImplementedError):
            dispatch._dispatch_bw(xformers_fmha.Inputs(query=q, key=q, value=q, attn_bias=typed), None)


def test_documents_offsets_live_on_the_runs_device():
    """BlockDiagonalMask.from_seqlens puts its offsets on "cuda" (cuda:0) unless told (attn_bias.py 104-111):
    the backend passes the run's device."""
    case = AttentionCase(2, 4, 8, 64, "fp16", mask=Documents((3, 5)))
    with sm90():
        plan = xformers_plan(case, CPU, cuda_tensor)
    assert plan.inference.bias.q_seqinfo.seqstart.device == CPU and plan.inference.packed


@pytest.mark.parametrize("case", [
    AttentionCase(2, 4, 129, 64, "fp16", alibi=True, mask=Causal()),
    AttentionCase(2, 4, 113, 64, "bf16", seq_k=203, bias="head", mask=KeyPadding((150, 203))),
    AttentionCase(2, 8, 127, 64, "bf16", kv_heads=2, bias="full", alibi=True),
    AttentionCase(1, 4, 128, 192, "bf16", head_dim_v=128, mask=Causal()),
], ids=lambda c: c.id)
def test_modifiers_dispatch_with_a_tensor_bias_forward_and_backward(case):
    """ALiBi and the bias input go in as one additive tensor (rows padded to 8); with the bias requiring grad the
    dispatcher must find a backward op that returns its gradient (cutlassB: SUPPORTS_ATTN_BIAS_GRAD, cutlass.py),
    and a value head dim other than q/k's is taken (SUPPORTS_DIFFERENT_VALUE_EMBED)."""
    with sm90():
        plan = xformers_plan(case, CPU, cuda_tensor)
        assert plan.training is not None, plan.backward_refused
        if case.modifiers:
            assert isinstance(plan.training.bias, torch.Tensor) and plan.training.bias.stride(-2) % 8 == 0
            assert plan.training.bias.requires_grad == (case.bias is not None)
        assert plan.training.bw is not None
        assert not plan.training.bw.not_supported_reasons(_inputs(case, plan.training)), case.id
    if case.bias is not None:
        assert _names(plan.training.bw) == "cutlassB"
