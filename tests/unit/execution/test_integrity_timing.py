"""Timed calls are judged: a planted kernel that passes correctness and cheats only when timed loses its figure
(timing_status rejected, the reason says which check), and honest controls keep theirs on every phase
(harness.execution.timed, benchmark.judge_timed, integrity; kernels: tests/fixtures/gamed_kernels.py)."""

import pytest

from harness import AttentionCase
from harness.execution.benchmark import measure_phase
from harness.execution.device import resolve_device
from harness.execution.in_process import InProcessExecutor
from harness.execution.rounds import Round
from harness.execution.runner import execute, prepare_case
from harness.measure.timing import TimingConfig
from harness.oracle.reference import reference_attention
from harness.spec.case import make_inputs
from harness.spec.masks import Causal
from harness.store.schema import REJECTED, TIMED
from tests.fixtures import gamed_kernels as gamed

CPU = resolve_device("cpu")
FAST = TimingConfig(warmup_ms=2, budget_ms=10, min_reps=5, max_reps=20)
CASE = AttentionCase(1, 2, 16, 32, "fp32")
#: 8 (batch, kv head) slices: a fingerprint of ~32 strided values sees ~2^24 of a call's contents (2 slices: ~2^6)
MANY_SLICES = AttentionCase(2, 4, 16, 32, "fp32")


def _timed(backend, phase, case=CASE, rounds=1, seed=3, executor=None):
    """The key timed as a run times it: one executor for correctness and timing (it kept the verdict's answers)."""
    executor = executor or InProcessExecutor()
    prepared = prepare_case(case, CPU, seed)
    verdict = execute(backend, prepared, executor=executor)
    assert verdict.status == "pass", verdict.reasons  # each passes correctness: it cheats only when timed
    result = None
    for index in range(rounds):
        result = measure_phase(backend, prepared, phase, verdict, config=FAST, peaks={}, executor=executor,
                               timing_round=Round(index, rounds, None if result is None else result.pooled))
        if result.row.timing_status != TIMED:
            break
    return result


@pytest.mark.parametrize("kernel, phase, words", [
    (gamed.CachedNoGrad, "fwd", "out err"),
    (gamed.GradsFirstThenZeros, "bwd", "dq err"),
    (gamed.GradsFirstThenZeros, "fwd+bwd", "dq err"),
    (gamed.MemoPerGraph, "bwd", "dq err"),  # every call's dO is new on its graph: the memo's answer is wrong
])
def test_a_kernel_that_cheats_when_timed_loses_its_figure(kernel, phase, words):
    result = _timed(kernel(), phase)
    row = result.row
    assert row.timing_status == REJECTED and words in row.timing_reason, row.timing_reason
    assert row.latency_ms is None and result.measurement is None and result.pooled is None  # never a number


@pytest.mark.parametrize("kernel, phase", [
    (gamed.ContentCache, "fwd"), (gamed.MemoPerGraphAndDO, "bwd"),
    *((memo, phase) for memo in (gamed.FingerprintMemo, gamed.FingerprintLRU) for phase in ("fwd", "bwd", "fwd+bwd")),
])
def test_a_cache_right_on_every_input_never_hits_a_timed_call(kernel, phase):
    """Every timed call's content is new (integrity.CallContent): a cache keyed on the inputs' content, or on ~32
    values of each, misses on every call, so its figure is its real work (gamed.WORK_S a call, at least)."""
    row = _timed(kernel(), phase, MANY_SLICES, rounds=2).row
    assert row.timing_status == TIMED and row.latency_ms >= 1000 * gamed.WORK_S, (row.timing_reason, row.latency_ms)


def test_a_background_thread_filling_the_output_late_is_rejected():
    kernel = gamed.BackgroundFill()
    kernel.honest = 2  # the two correctness calls
    row = _timed(kernel, "fwd").row
    assert row.timing_status == REJECTED and "out has NaN" in row.timing_reason, row.timing_reason


class _WritesWhenTimed(gamed.WritesInput):
    name = "gamed-writes-when-timed"

    def forward(self, q, k, v, *, mask, scale):
        self.calls += 1
        return gamed.attend(q, k, v, mask, scale) if self.calls <= 2 else super().forward(q, k, v, mask=mask,
                                                                                             scale=scale)


def test_writing_into_an_input_while_timed_is_rejected():
    row = _timed(_WritesWhenTimed(), "fwd").row
    # judged first: v halved between calls makes the answers wrong; else the snapshot names the input written
    assert row.timing_status == REJECTED and ("wrote into its input v" in row.timing_reason
                                              or " err " in row.timing_reason), row.timing_reason


@pytest.mark.parametrize("kernel", [gamed.Recomputing, gamed.Nondeterministic, gamed.CaseCache])
@pytest.mark.parametrize("phase", ["fwd", "bwd", "fwd+bwd"])
def test_honest_controls_are_timed_on_every_phase_and_round(kernel, phase):
    case = AttentionCase(1, 2, 16, 32, "fp32", mask=Causal()) if kernel is gamed.CaseCache else CASE
    row = _timed(kernel(), phase, case, rounds=2).row
    assert row.timing_status == TIMED and row.latency_ms > 0 and row.rounds == 2, row.timing_reason


@pytest.mark.parametrize("isolate", [False, True])
def test_every_timed_answer_comes_back_to_be_judged_in_process_and_from_a_worker(isolate):
    """Nothing is compared where the calls ran (issue 47): every observed answer of every phase comes back, from the
    run's own process and from a worker alike, and is judged in the run's process."""
    from harness.backends.naive import Naive
    from harness.execution.call import Call
    from harness.execution.executor import make_executor
    from harness.execution.timed import TimingCall

    executor = make_executor(CPU, isolate=isolate)
    try:
        for phase, quantities in (("fwd", {"out"}), ("bwd", {"dq", "dk", "dv"}),
                                  ("fwd+bwd", {"out", "dq", "dk", "dv"})):
            observed = executor.time(Naive(), TimingCall(Call(CASE, 3), phase, FAST), CPU).observed
            assert observed and all(set(o) >= quantities for o in observed), phase
            assert _timed(Naive(), phase, executor=executor).row.timing_status == TIMED
    finally:
        executor.close()


@pytest.mark.parametrize("case", [
    AttentionCase(1, 2, 9, 16, "bf16", seq_k=12, fp8_kv="tensor"),
    AttentionCase(1, 6, 9, 16, "bf16", kv_heads=3, seq_k=12, fp8_kv="head", fp8_q=True),
])
def test_an_fp8_case_s_call_content_is_exact_after_quantization(case):
    """An FP8 KV cache (and q) is quantized with scales fixed by the case (spec/fp8.py): v x 2 may saturate e4m3, so a
    call's content scales v by signs alone; q and k take signs per column. A sign commutes with e4m3 quantization
    bit for bit (its grid and saturation are symmetric): what the backend gets (backend_inputs, as timing gives it)
    is the quantized inputs times the content's factors, so the answer follows exactly."""
    import torch

    from harness.backends.naive import Naive
    from harness.execution.bound import backend_inputs
    from harness.execution.integrity import CallContent

    inputs = make_inputs(case)
    inputs = inputs._replace(q=inputs.q * 40, v=inputs.v * 300)  # past e4m3's range: saturation must stay symmetric
    base = [t.float() for t in backend_inputs(Naive(), case, inputs, requires_grad=False)[:3]]
    assert backend_inputs(Naive(), case, inputs, requires_grad=False)[2].dtype == torch.float8_e4m3fn
    generator = torch.Generator().manual_seed(2)
    for _ in range(4):
        content = CallContent.draw(case, generator)
        assert set(content.v.flatten().tolist()) <= {-1.0, 1.0}
        got = backend_inputs(Naive(), case, content.inputs(inputs), requires_grad=False)[:3]
        expected = content.inputs(inputs._replace(q=base[0] if case.fp8_q else inputs.q.float(), k=base[1],
                                                  v=base[2]))[:3]
        for name, mine, theirs in zip("qkv", got, expected):
            if name != "q" or case.fp8_q:
                assert torch.equal(mine.float(), theirs), name


def test_a_backward_alone_s_graph_is_built_on_the_round_s_own_content():
    """RoundGuard: the round draws content of its own, which the phase is built on (the backward alone's graph: q, k
    and v unlike the verified inputs'), and its calls' content on top; every answer is undone to the verified one."""
    from harness.execution.integrity import RoundGuard

    inputs = make_inputs(CASE, "cpu", 3)
    guard = RoundGuard(CASE, "bwd", inputs)
    assert not any(a.equal(b) for a, b in zip(guard.inputs[:3], inputs[:3]))


@pytest.mark.parametrize("case, phase", [
    (AttentionCase(2, 4, 8, 16, "fp32", kv_heads=2, mask=Causal()), "fwd+bwd"),  # GQA: a q head takes its kv head's
    (AttentionCase(2, 4, 8, 16, "fp32", kv_heads=2, mask=Causal()), "bwd"),
    (AttentionCase(1, 2, 8, 16, "fp32", sinks=True), "fwd+bwd"),  # dsinks sums over the batch: uniform v, dO
])
def test_a_call_s_content_gives_exactly_the_round_s_answer_once_undone(case, phase):
    """CallContent: the float64 reference of a call's content, divided by its factors, is the round's answer (to
    1e-12: exact but for float64's own rounding); contents differ call to call; the backward alone keeps q, k, v."""
    import torch

    from harness.execution.integrity import CallContent
    from harness.store.schema import BWD

    inputs = make_inputs(case, "cpu", 5)
    ref = reference_attention(case, inputs)
    generator = torch.Generator().manual_seed(1)
    uniform = inputs.sinks is not None
    contents = [CallContent.draw(case, generator, backward_alone=phase == BWD, uniform=uniform) for _ in range(3)]
    assert len({tuple(torch.cat([t.flatten() for t in (c.qk, c.v, c.d_out) if t is not None]).tolist())
                for c in contents}) == 3
    for content in contents:
        theirs = reference_attention(case, content.inputs(inputs))
        for quantity in ("out", *case.grads):
            undone = content.undo(quantity, theirs.get(quantity), case.heads // case.kv_heads)
            assert (undone - ref.get(quantity)).abs().max() <= 1e-12, quantity
        if phase == BWD:
            assert all(torch.equal(a, b) for a, b in zip(content.inputs(inputs)[:3], inputs[:3]))


def test_every_timed_call_runs_on_content_no_earlier_call_saw():
    """A kernel that records a fingerprint (~32 strided values) of every call's q, k and v: over two timed rounds
    (estimate, warm-up and samples), no two calls saw the same, on a case of 8 slices."""
    seen = []

    class Recording(gamed._Planted):
        name = "recording"

        def forward(self, q, k, v, *, mask, scale):
            seen.append(gamed.fingerprint(q, k, v))
            return gamed.attend(q, k, v, mask, scale)

    verified = gamed.fingerprint(*make_inputs(MANY_SLICES, "cpu", 3)[:3])  # what the correctness calls saw
    for phase in ("fwd", "fwd+bwd"):
        seen.clear()
        result = _timed(Recording(), phase, MANY_SLICES, rounds=2)
        timed = [f for f in seen if f != verified]
        assert result.row.timing_status == TIMED and len(timed) > 4 and len(set(timed)) == len(timed), phase


@pytest.mark.parametrize("drawn", [0, 1])
def test_each_timed_call_is_judged_when_the_draw_after_it_says_so(monkeypatch, drawn):
    """integrity.RoundGuard.after_call draws, after each timed call returns, whether it is judged (odds
    1/CHECK_ONE_IN): drawn every time, every sample's answer is observed; never, the last alone. A kernel wrong on m
    of a round's other calls escapes with odds (1 - 1/CHECK_ONE_IN)^m."""
    from harness.backends.naive import Naive
    from harness.execution import integrity
    from harness.execution.call import Call
    from harness.execution.timed import TimingCall

    monkeypatch.setattr(integrity.secrets, "randbelow", lambda n, _d=drawn: _d)
    result = InProcessExecutor().time(Naive(), TimingCall(Call(CASE, 3), "fwd", FAST), CPU)
    n = result.measurement.n  # the first may be the estimate's last call, made before it was known to be a sample
    assert n > 2 and (n - 1 <= len(result.observed) <= n if drawn == 0 else len(result.observed) == 1)
