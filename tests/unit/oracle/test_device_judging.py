"""Verdicts computed where the float64 reference is kept (oracle/placement.py): on a GPU run the device, with the
same figures as the host's comparison; the device's own parameter is CUDA-marked (skipped here, run on a GPU)."""

from __future__ import annotations

import pytest
import torch

from harness.cases.case import AttentionCase
from harness.cases.masks import Causal
from harness.oracle import placement, verdict
from harness.oracle.verdict import _device_chunks, _host_chunks, compare
from harness.run.runner import prepare_case

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason=f"needs a CUDA device; torch {torch.__version__} sees none")])]


def test_the_reference_stays_on_a_gpu_when_it_fits_a_quarter_of_its_free_memory():
    cuda = torch.device("cuda", 0)
    assert placement.judging_device(cuda, 10 * 2 ** 30, free_bytes=40 * 2 ** 30) == cuda
    assert placement.judging_device(cuda, 10 * 2 ** 30 + 1, free_bytes=40 * 2 ** 30) == torch.device("cpu")
    assert placement.judging_device(torch.device("cpu"), 1) == torch.device("cpu")
    assert "1/4" in placement.RULE or "0.25" in placement.RULE


def _with_bad_entries(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(n, generator=g, dtype=torch.float64)
    actual = (ref + 1e-3 * torch.randn(n, generator=g, dtype=torch.float64)).to(torch.bfloat16)
    actual[torch.randint(n, (3,), generator=g)] = float("inf")          # bad: non-finite where the reference is finite
    ref[torch.randint(n, (2,), generator=g)] = float("nan")             # a non-finite reference: its NaN propagates
    return actual, ref


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("bad", [False, True])
def test_the_device_s_chunks_give_the_host_s_figures(seed, bad, monkeypatch):
    """_device_chunks (no chunk waits for the host) against _host_chunks on the same tensors, several chunks each."""
    monkeypatch.setattr(verdict, "CHUNK", 1000)
    monkeypatch.setattr(verdict, "DEVICE_CHUNK", 700)
    if bad:
        actual, ref = _with_bad_entries(seed, 5000)
    else:
        ref = torch.randn(5000, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        actual = ref.to(torch.bfloat16)
    for factor in (1.0, -0.5):
        host = [repr(float(t)) for t in _host_chunks(actual, ref, factor, True)]  # repr: NaN equals NaN
        device = [repr(float(t)) for t in _device_chunks(actual, ref, factor, True)]
        assert host == device


@pytest.mark.parametrize("device", DEVICES)
def test_a_case_is_judged_where_its_reference_is_kept(device):
    """prepare_case keeps the reference where placement says; a verdict there equals the float64 one on the host."""
    device = torch.device(device)
    case = AttentionCase(2, 4, 96, 32, "bf16", mask=Causal())
    prepared = prepare_case(case, device)
    kept = placement.judging_device(device, placement.reference_bytes(prepared.reference.tensors()))
    assert all(t.device.type == kept.type for t in prepared.reference.tensors() if t is not None)
    answer = prepared.reference.out.to(torch.bfloat16)
    check = prepared.judged("out", answer, "sdpa")
    host = compare(answer.cpu(), prepared.reference.out.cpu())
    assert check.passed and check.err == host[0] and check.largest == host[2]
    wrong = answer.clone()
    wrong[0, 0, 5, 0] += 1.0
    assert not prepared.judged("out", wrong, "sdpa").passed


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_a_timed_round_s_answers_are_judged_where_the_reference_is(device, phase):
    """A round timed in this process on `device`: its observed answers stay there (TimedRound.finish) and are judged
    against slices of references made there; an answer off by 1 (its checksum forged to match) fails."""
    from harness.backends.naive import Naive
    from harness.calls.call import Call
    from harness.calls.round import Observed, checksum
    from harness.calls.timed import TimingCall, run_timing
    from harness.measure.timing import TimingConfig
    from harness.run.judge import judge_timed

    device = torch.device(device)
    case = AttentionCase(2, 4, 64, 32, "fp32", mask=Causal())
    prepared = prepare_case(case, device)
    timing = TimingCall(Call(case), phase, TimingConfig(warmup_ms=1, budget_ms=5, min_reps=4, max_reps=8))
    result = run_timing(Naive(), timing, device)
    assert result.failure is None and result.observed
    assert all(a.device.type == device.type for o in result.observed for a in o.answers.values())
    assert judge_timed("naive", prepared, phase, result.observed, timing.seed) == ""
    last = result.observed[-1]
    quantity = next(iter(last.answers))
    wrong = dict(last.answers, **{quantity: last.answers[quantity] + 1.0})
    forged = Observed(wrong, {q: int(checksum(a)) for q, a in wrong.items()}, last.index)
    assert " err " in judge_timed("naive", prepared, phase, [*result.observed[:-1], forged], timing.seed)
