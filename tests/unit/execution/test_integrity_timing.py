"""Timed calls are judged: a planted kernel that passes correctness and cheats only when timed loses its figure
(timing_status rejected, the reason says which check), and honest controls keep theirs on every phase
(harness.calls.timed, run/judge.py, integrity, content; kernels: tests/fixtures/gamed_kernels.py)."""

import pytest

from harness import AttentionCase
from harness.run.benchmark import measure_phase
from harness.calls.device import resolve_device
from harness.isolation.in_process import InProcessExecutor
from harness.run.rounds import Round
from harness.run.runner import execute, prepare_case
from harness.measure.timing import TimingConfig
from harness.oracle.reference import reference_attention
from harness.cases.case import make_inputs
from harness.cases.masks import CacheCausal, Causal
from harness.store.schema import NOT_TIMED, REJECTED, TIMED
from harness.backends.naive import Naive
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


@pytest.mark.parametrize("kernel, phase, status", [
    (Naive, "fwd+bwd", NOT_TIMED), (gamed.CachedNoGrad, "fwd", REJECTED), (gamed.GradsFirstThenZeros, "bwd", REJECTED),
])
def test_a_round_the_load_left_unauditable_has_no_figure_and_is_still_judged(monkeypatch, kernel, phase, status):
    """run/audit.py Audit.loaded (a pool's spin beside other load): the round gives no figure and no verdict - not
    timed, with the reason - but its answers are judged all the same, and a wrong one is rejected."""
    from harness.run import audit, benchmark

    real = audit.audited_time
    monkeypatch.setattr(benchmark, "audited_time", lambda *a: (real(*a)[0], audit.Audit("spun: not auditable at "
                                                                                        "this load", loaded=True)))
    row = _timed(kernel(), phase).row
    assert row.timing_status == status and row.latency_ms is None, row.timing_reason
    assert ("not auditable at this load" in row.timing_reason) == (status == NOT_TIMED)


@pytest.mark.parametrize("kernel, phase", [
    (gamed.ContentCache, "fwd"), (gamed.MemoPerGraphAndDO, "bwd"),
    *((memo, phase) for memo in (gamed.FingerprintMemo, gamed.FingerprintLRU) for phase in ("fwd", "bwd", "fwd+bwd")),
])
def test_a_cache_right_on_every_input_never_hits_a_timed_call(kernel, phase):
    """Every timed call's content is new (content.Contents): a cache keyed on the inputs' content, or on ~32
    values of each, misses on every call, so its figure is its real work (gamed.WORK_S a call, at least)."""
    row = _timed(kernel(), phase, MANY_SLICES, rounds=2).row
    assert row.timing_status == TIMED and row.latency_ms >= 1000 * gamed.WORK_S, (row.timing_reason, row.latency_ms)


def test_an_answer_that_is_a_tensor_subclass_is_refused_when_judged_and_when_timed():
    """issue 62 item 2: an answer must be exactly torch.Tensor - a subclass runs its own code when the harness reads
    it, after the clock stopped. Refused by the contract at correctness; a kernel that returns one only on timed
    calls (its data computed when first read) loses its figure."""
    prepared = prepare_case(CASE, CPU, 3)
    verdict = execute(gamed.AlwaysSubclass(), prepared, executor=InProcessExecutor())
    assert verdict.status == "fail" and "a subclass of torch.Tensor" in verdict.row("fwd").reason
    row = _timed(gamed.DeferredSubclass(), "fwd").row
    assert row.timing_status == REJECTED and "_Deferred, a subclass of torch.Tensor" in row.timing_reason, (
        row.timing_reason)
    assert row.latency_ms is None


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
    from harness.calls.call import Call
    from harness.isolation.executor import make_executor
    from harness.calls.timed import TimingCall

    executor = make_executor(CPU, isolate=isolate)
    try:
        for phase, quantities in (("fwd", {"out"}), ("bwd", {"dq", "dk", "dv"}),
                                  ("fwd+bwd", {"out", "dq", "dk", "dv"})):
            observed = executor.time(Naive(), TimingCall(Call(CASE, 3), phase, FAST), CPU).observed
            assert observed and all(set(o.answers) >= quantities and set(o.sums) == set(o.answers)
                                    for o in observed), phase
            assert _timed(Naive(), phase, executor=executor).row.timing_status == TIMED
    finally:
        executor.close()


@pytest.mark.parametrize("case", [
    AttentionCase(2, 4, 8, 16, "fp32", kv_heads=2, mask=Causal()),
    AttentionCase(1, 6, 9, 16, "bf16", kv_heads=3, seq_k=12, fp8_kv="head", fp8_q=True),  # heads of their own ranges
    AttentionCase(1, 2, 8, 16, "fp32", softcap=30.0, sinks=True),
])
@pytest.mark.parametrize("phase", ["fwd", "bwd", "fwd+bwd"])
def test_each_call_s_content_is_a_fresh_draw_the_run_makes_again_from_its_seed(case, phase):
    """content.Contents: call 0 is the round's own (q, k, v and dO drawn, the verified sinks and bias); each call i >= 1
    renews what its phase
    reads (fwd: q, k, v; bwd: dO alone, on its graph; fwd+bwd: all four), and no renewed input of a call is a
    per-slice transform of another call's - not a sign or scale (|q| differs), not the same values. A second Contents
    from the same seed (the run's, judging) makes the same bits; the inputs keep the case's ranges (make_inputs')."""
    import torch

    from harness.calls.content import Contents, renewed

    verified = make_inputs(case, "cpu", 3)
    contents, again = (Contents(case, phase, 11, "cpu", verified.sinks, verified.bias) for _ in range(2))
    assert all(not torch.equal(a, b) for a, b in zip(contents.round[:4], verified[:4]))  # the round's own
    assert all(torch.equal(a, b) for a, b in zip(contents.round[4:], verified[4:]) if a is not None)  # sinks, bias
    fresh = set(renewed(phase))
    calls = [contents.call(i) for i in range(1, 6)]
    for i, call in enumerate(calls, 1):
        assert all(torch.equal(a, b) for a, b in zip(call, again.call(i)) if a is not None)
        for name in ("q", "k", "v", "d_out"):
            mine, round_own = getattr(call, name), getattr(contents.round, name)
            assert torch.equal(mine, round_own) != (name in fresh), name
            assert mine.dtype == case.dtype and mine.shape == round_own.shape
    for name in fresh:
        magnitudes = [getattr(c, name).float().abs() for c in calls]
        assert all(not torch.equal(x, y) for i, x in enumerate(magnitudes) for y in magnitudes[i + 1:]), name
        drawn = torch.stack([getattr(c, name).float() for c in calls])  # the ranges per head, as make_inputs' are
        ratio = drawn.std(dim=(0, 1, 3, 4)) / getattr(make_inputs(case, "cpu", 5), name).float().std(dim=(0, 2, 3))
        assert ((ratio > 0.6) & (ratio < 1.6)).all(), (name, ratio)


def test_a_process_draws_each_pool_once_and_kept_pools_make_the_same_contents():
    """The pools depend on an input's name and size alone (content.draw_pool): a process keeps them (CallCaches in a
    worker, RunCaches in the run) and draws each once, and contents made on kept pools are bit for bit those made on
    pools drawn afresh; what differs between rounds is the seed, and with it every renewed input."""
    import torch

    from harness.calls.cache import RunCaches
    from harness.calls.content import Contents

    case, pools = AttentionCase(2, 4, 16, 32, "bf16", kv_heads=2), RunCaches().pools
    kept = [Contents(case, "fwd+bwd", seed, "cpu", pools=pools) for seed in (1, 2, 1)]
    assert len(pools) == 4  # q, k, v and dO of one size each: drawn once for the three rounds
    afresh = Contents(case, "fwd+bwd", 1, "cpu")
    for i in range(3):
        assert all(torch.equal(a, b) for a, b in zip(kept[0].call(i, 7)[:4], afresh.call(i, 7)[:4]))
        assert all(torch.equal(a, b) for a, b in zip(kept[2].call(i, 7)[:4], kept[0].call(i, 7)[:4]))
        assert not any(torch.equal(a, b) for a, b in zip(kept[1].call(i, 7)[:4], kept[0].call(i, 7)[:4]))
    Contents(AttentionCase(1, 2, 16, 32, "fp32"), "fwd", 1, "cpu", pools=pools)
    assert len(pools) == 8


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float8_e4m3fn", "float64"])
def test_an_answer_s_checksum_reads_every_element_in_any_layout(dtype):
    """checksum: the wrapping sum of an answer's bits (32 bits; 64 for 8-byte elements), the same on any view of the
    same elements (a transposed answer, its contiguous copy), changed by any one element's change of one bit."""
    import torch

    from harness.calls.round import checksum

    answer = torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(0)).to(getattr(torch, dtype))
    laid_out = answer.transpose(1, 2).contiguous().transpose(1, 2)  # the same elements, in another layout
    assert not laid_out.is_contiguous() and checksum(laid_out) == checksum(answer)
    assert checksum(answer).dtype == (torch.int64 if answer.element_size() == 8 else torch.int32)
    for flat in (0, 77, answer.numel() - 1):
        changed = answer.clone()
        bits = changed.view(-1).view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[
            answer.element_size()])
        bits[flat] ^= 1
        assert checksum(changed) != checksum(answer), flat


def test_a_checked_round_is_built_on_the_round_s_own_inputs(monkeypatch):
    """run_timing builds a checked round (the backward alone's graph: its q, k and v) on the round's own inputs,
    Contents(seed).round - not the verified ones - and each call's content follows."""
    import torch

    from harness.backends.naive import Naive
    from harness.calls import timed
    from harness.calls.call import Call
    from harness.calls.content import Contents

    built = []
    monkeypatch.setattr(timed, "TimedRound", lambda *a, _real=timed.TimedRound: built.append(a) or _real(*a))
    verified = make_inputs(CASE, "cpu", 3)
    timed.run_timing(Naive(), timed.TimingCall(Call(CASE, 3), "bwd", FAST, seed=12345), CPU)
    (backend, case, phase, device, inputs, contents, ticker), = built
    assert all(torch.equal(a, b) for a, b in zip(inputs, Contents(CASE, "bwd", 12345, "cpu").round)
               if a is not None) and contents.seed == 12345
    assert not torch.equal(inputs.q, verified.q)


def test_a_slice_s_reference_is_the_whole_reference_s_slice_and_the_judge_fails_any_other_content_s_answer():
    """run/judge.py judges a call on a (batch, kv head) slice drawn after its answer arrived, against the float64
    reference of that slice of the call's own content (reference_attention(only=), bit for bit the whole reference's
    slice: GQA, a mask). A right answer passes on every slice; an earlier call's answer, or the round's own, re-scaled
    per slice as the contents of 770af44 allowed, fails on every slice it is drawn on, naming it."""
    import torch

    from harness.calls.content import Contents
    from harness.calls.round import Observed, checksum
    from harness.oracle.reference import attended
    from harness.run import judge

    case = AttentionCase(2, 4, 8, 16, "fp32", kv_heads=2, mask=Causal())
    prepared = prepare_case(case, CPU, 3)
    contents = Contents(case, "fwd+bwd", 99, "cpu")
    refs = {i: reference_attention(case, attended(case, contents.call(i))) for i in (1, 2)}
    for b in range(case.batch):
        for kv in range(case.kv_heads):
            part = reference_attention(case, contents.call(1), only=(b, kv))
            for quantity in ("out", *case.grads):
                assert torch.equal(part.get(quantity), judge.part(quantity, refs[1].get(quantity), (b, kv), 2))

    def observed(answers: dict, index: int) -> Observed:
        answers = {q: t.to(torch.float32) for q, t in answers.items()}
        return Observed(answers, {q: int(checksum(t)) for q, t in answers.items()}, index)

    right = {q: refs[2].get(q) for q in ("out", *case.grads)}
    stale = {q: refs[1].get(q) * -2.0 for q in ("out", *case.grads)}  # call 1's, re-scaled
    for _ in range(8):
        assert judge.judge_timed("naive", prepared, "fwd+bwd", [observed(right, 2)], 99) == ""
        problem = judge.judge_timed("naive", prepared, "fwd+bwd", [observed(stale, 2)], 99)
        assert problem.startswith("[fwd+bwd, the last timed call, on content no earlier call saw] out err")
        assert "(batch " in problem and ", kv head " in problem, problem
    # a session may drop a prepared case's inputs (it keeps the reference): the judge draws the modifiers again
    sinks = AttentionCase(1, 2, 8, 16, "fp32", sinks=True)
    kept = prepare_case(sinks, CPU, 3)
    timed = Contents(sinks, "fwd", 5, "cpu", kept.inputs.sinks, None).call(1)  # no nonce: no brackets
    answer = reference_attention(sinks, timed, grads=False).out
    kept.inputs = None
    assert judge.judge_timed("naive", kept, "fwd", [observed({"out": answer}, 1)], 5) == ""
    assert "returned no dq" in judge.judge_timed("naive", prepared, "fwd+bwd", [observed({"out": right["out"]}, 2)],
                                                 99)
    assert "not as observed answers" in judge.judge_timed("naive", prepared, "fwd", [observed(right, 0)], 99)


def test_every_timed_call_runs_on_content_no_earlier_call_saw():
    """A kernel that records a fingerprint (~32 strided values) of every call's q, k and v: over two timed rounds,
    on a case of 8 slices, no content comes back once another followed it - the warm-up calls repeat the content
    of the call before them (timing.WARMUP_RENEWS), every estimate call and sample has one no earlier call saw."""
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
        runs = [f for i, f in enumerate(timed) if i == 0 or f != timed[i - 1]]  # a warm-up repeats the one before
        assert result.row.timing_status == TIMED and len(set(runs)) == len(runs), phase
        assert len(runs) >= result.row.n_samples > 4 and len(timed) > len(runs), phase  # the samples' own, warm-ups


def test_each_round_judges_its_last_call_and_a_uniform_draw_of_its_other_samples(monkeypatch):
    """round.TimedRound.after_call keeps JUDGED_DRAWS of a round's samples but the last, drawn as each returns
    (selection sampling: every sample kept with odds k/n, exactly k copied), and after_last_call the last: over 3,000
    seeded rounds of 12 samples each sample is kept ~k/12 of the time, and a kernel wrong on 6 of them escapes with
    the odds C(6, k) / C(12, k) the docs state (k = 2: 22.7 %). A real round sends k + 1 answers however many samples
    it had."""
    import math
    import random
    import torch

    from harness.backends.naive import Naive
    from harness.calls import round as timed_round
    from harness.calls.call import Call
    from harness.calls.content import Contents
    from harness.calls.timed import TimingCall

    k, n, rounds = timed_round.JUDGED_DRAWS, 12, 3000
    monkeypatch.setattr(timed_round.secrets, "randbelow", random.Random(0).randrange)
    contents = Contents(CASE, "fwd", 3, "cpu")
    kept, escaped = [0] * n, 0
    for _ in range(rounds):
        guard = timed_round.TimedRound(Naive(), CASE, "fwd", CPU, contents.round, contents)
        copied = []
        guard.answers = lambda value: copied.append(value) or {"out": value}
        for i in range(n):
            guard.after_call(torch.tensor(i), n - i)
        drawn = [int(o.answers["out"]) for o in guard.drawn]
        assert len(drawn) == len(set(drawn)) == len(copied) == k
        for i in drawn:
            kept[i] += 1
        escaped += not set(drawn) & set(range(6))
    mean, sd = rounds * k / n, math.sqrt(rounds * k / n * (1 - k / n))
    assert all(abs(c - mean) < 4 * sd for c in kept), kept
    odds = math.comb(6, k) / math.comb(n, k)
    assert abs(escaped - rounds * odds) < 4 * math.sqrt(rounds * odds), (escaped, rounds * odds)

    # at least 2k samples whatever the machine's load (FAST's budget alone gives min_reps, 5, on a loaded one)
    many = TimingConfig(warmup_ms=2, budget_ms=10, min_reps=2 * k, max_reps=20)
    result = InProcessExecutor().time(Naive(), TimingCall(Call(CASE, 3), "fwd", many), CPU)
    assert result.measurement.n >= 2 * k and len(result.observed) == k + 1


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("case", [
    AttentionCase(2, 4, 8, 16, "bf16", kv_heads=2, mask=Causal()),
    AttentionCase(1, 2, 9, 16, "bf16", seq_k=12, fp8_kv="tensor"),  # FP8: the content's inputs made and copied in
    AttentionCase(2, 4, 1, 32, "fp32", seq_k=40, mask=CacheCausal((40, 30)), page_size=16),  # pages: likewise
])
@pytest.mark.parametrize("phase", ["fwd", "bwd", "fwd+bwd"])
def test_a_call_s_content_written_into_the_buffers_is_its_inputs_laid_out(layout, case, phase):
    """round.TimedRound.fresh(inputs): what the buffers hold afterwards is bit for bit what `sources` makes of the call's
    inputs, cast to the case's dtype - from the float32 content the guard gives it: the one copy a buffer into a
    transposed view (which casts), a paged cache's pages, FP8's quantized inputs; the backward alone's q, k and v keep
    the round's, the forward alone's dO (it reads none) too."""
    import torch

    from harness.backends.naive import Naive
    from harness.calls.content import Contents
    from harness.calls.round import TimedRound

    backend = type("Laid", (Naive,), {"layout": layout})()
    verified = make_inputs(case, "cpu", 4)
    contents = Contents(case, phase, 4, "cpu", verified.sinks, verified.bias)
    timed = TimedRound(backend, case, phase, CPU, contents.round, contents)
    kept = {name: t.detach().clone() for name, t in timed.buffers.items()}
    for index in range(1, 4):
        timed.fresh(contents.call(index, cast=False))  # as the guard writes it: float32, cast by the buffers' copy
        expected = timed.sources(contents.call(index))
        assert set(expected) == {"bwd": {"dO"}, "fwd": {"q", "k", "v"}, "fwd+bwd": {"q", "k", "v", "dO"}}[phase]
        for name, t in timed.buffers.items():
            want = expected.get(name, kept[name])
            assert t.dtype == want.dtype and torch.equal(t.detach().view(torch.uint8), want.view(torch.uint8)), name


@pytest.mark.parametrize("kernel, phase", [(gamed.RescaledMemo, "fwd"), (gamed.LinearInDO, "bwd")])
def test_issue_62_s_rescaling_plugins_get_no_false_figure(kernel, phase):
    """Issue 62's first and fifth plugins, exact against the sign and power-of-two contents of 770af44 (1.44x fwd;
    5.48x bwd there): on fresh draws a memo keyed on |q| never hits, so it is timed at its real work, and gradients
    re-scaled by the factor read off a new dO are wrong, so the round is rejected."""
    row = _timed(kernel(), phase, MANY_SLICES).row
    if kernel is gamed.RescaledMemo:
        assert row.timing_status == TIMED and row.latency_ms >= 1000 * gamed.WORK_S, (row.timing_reason,
                                                                                     row.latency_ms)
    else:
        assert row.timing_status == REJECTED and "err" in row.timing_reason and row.latency_ms is None, (
            row.timing_reason)


def test_an_answer_filled_when_the_harness_reads_it_costs_its_time_or_its_figure():
    """Issue 62 item 2: every timed call's answer is read in full inside its own timed region (its checksum,
    round.TimedRound.in_call), and the run judges only bytes with that checksum (run/judge.py `received`). A kernel
    returning uninitialised memory that a profile hook fills when the harness's answer-reading frame starts - after
    the clock, as on 770af44 - is rejected; one that fills when the timed read starts has its work timed."""
    row = _timed(gamed.FilledOnRead(), "fwd").row
    assert row.timing_status == REJECTED and "changed after the call's clock stopped" in row.timing_reason, (
        row.timing_reason)
    timed = _timed(gamed.FilledOnTimedRead(), "fwd").row
    assert timed.timing_status == TIMED and timed.latency_ms >= 1000 * gamed.WORK_S, (timed.timing_reason,
                                                                                     timed.latency_ms)
