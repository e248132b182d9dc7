"""Timed calls are judged: a planted kernel that passes correctness and cheats only when timed loses its figure
(timing_status rejected, the reason says which check), and honest controls keep theirs on every phase
(harness.execution.timed, benchmark.judge_timed, integrity; kernels: tests/fixtures/gamed_kernels.py)."""

import pytest

from harness import AttentionCase
from harness.execution.benchmark import measure_phase
from harness.execution.device import resolve_device
from harness.execution.in_process import InProcessExecutor
from harness.execution.integrity import RoundInputs, TRANSFORMS, Transform, round_inputs, seen_violation
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
    (gamed.MemoPerGraph, "bwd", "on new inputs (q,k x1, v x-1, dO x-1)] dq err"),  # a new dO on its graph
    (gamed.ContentCache, "fwd", "faster on inputs it has seen"),
    (gamed.MemoPerGraphAndDO, "bwd", "faster on inputs it has seen"),  # right on the new dO: slow only there
])
def test_a_kernel_that_cheats_when_timed_loses_its_figure(kernel, phase, words):
    result = _timed(kernel(), phase)
    row = result.row
    assert row.timing_status == REJECTED and words in row.timing_reason, row.timing_reason
    assert row.latency_ms is None and result.measurement is None and result.pooled is None  # never a number


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
def test_a_deterministic_kernel_s_timed_answers_are_told_where_they_ran_and_judged_by_the_verdict(isolate):
    """In-process, the executor that ran the correctness call kept its answers (Call.keep): a round's every answer
    that is a verified one scaled, bit for bit, is told, not sent back, and the rows are timed; an executor that did
    not run it (a fresh one) sends them and they are judged in float64. From a worker nothing is told (a comparison
    where the backend's code runs could be its own, issue 47): every answer comes back, and the rows are timed."""
    from harness.execution.call import Call
    from harness.execution.executor import make_executor
    from harness.execution.integrity import round_options
    from harness.execution.timed import TimingCall
    from harness.backends.naive import Naive

    executor = make_executor(CPU, isolate=isolate)
    try:
        prepared = prepare_case(CASE, CPU, 3)
        verdict = execute(Naive(), prepared, executor=executor)
        assert verdict.answer_id and set(verdict.verified) == {("no-grad", "out"), ("grad", "out"), ("grad", "dq"),
                                                               ("grad", "dk"), ("grad", "dv")}
        for phase, quantities in (("fwd", {"out"}), ("bwd", {"dq", "dk", "dv"}),
                                  ("fwd+bwd", {"out", "dq", "dk", "dv"})):
            timing = TimingCall(Call(CASE, 3), phase, FAST, inputs=round_inputs(3, (CASE.id, "naive", phase), 0,
                                                                                **round_options(CASE, phase)),
                                verified=verdict.answer_id)
            observed = executor.time(Naive(), timing, CPU).observed
            told = set() if isolate else quantities
            assert [o.scaled_verified for o in observed] == [told] * 2, phase
            returned = [({"out"} if o.out is not None else set()) | set(o.grads) for o in observed]
            assert [r & quantities for r in returned] == [quantities - told] * 2, phase
            assert _timed(Naive(), phase, executor=executor).row.timing_status == TIMED
        fresh = InProcessExecutor().time(Naive(), timing, CPU).observed
        assert not fresh[-1].scaled_verified and set(fresh[-1].grads) == {"dq", "dk", "dv"}
    finally:
        executor.close()


def test_every_transform_gives_exactly_the_transformed_answer():
    """The expected answer of transformed inputs is the verified one scaled: exact in floating point (float64
    reference of the transformed inputs against the scaled reference, to the last bit for out and dv)."""
    case = AttentionCase(1, 2, 8, 16, "fp32", mask=Causal())
    inputs = make_inputs(case, "cpu", 5)
    ref = reference_attention(case, inputs)
    for t in TRANSFORMS:
        theirs = reference_attention(case, t.inputs(inputs))
        for quantity in ("out", "dq", "dk", "dv"):
            assert (theirs.get(quantity) - ref.get(quantity) * t.factor(quantity)).abs().max() <= 1e-12, (t, quantity)


def test_a_round_s_new_inputs_change_every_answer_and_rounds_differ():
    seen = set()
    for index in range(3):
        r = round_inputs(11, ("c", "b", "fwd"), index)
        assert isinstance(r, RoundInputs) and not r.seen.identity and len(r.confirm) == 4  # every (qk, v) unlike seen and new; slices top up the rest
        for q in ("out", "dq", "dk", "dv"):
            assert r.new.factor(q) != r.seen.factor(q)
        assert all((c.qk, c.v) not in {(r.seen.qk, r.seen.v), (r.new.qk, r.new.v)} for c in r.confirm)
        seen.add(r.seen)
    assert len(seen) == 3
    assert round_inputs(11, ("c", "b", "fwd"), 0) != round_inputs(12, ("c", "b", "fwd"), 0)  # the seed decides


def test_seen_violation_on_synthetic_samples():
    assert seen_violation([0.01] * 9 + [5.0], [0.5, 0.6, 0.7]).startswith("faster on inputs it has seen")
    assert seen_violation([1.0] * 10, [1.9, 5.0, 2.5]) == ""  # one fast enough new call: honest
    assert seen_violation([1.0, 1.1, 0.9], [50.0]) != "" and seen_violation([], [1.0]) == ""
    assert Transform().identity


def test_an_fp8_cache_s_round_inputs_are_exact_after_quantization():
    """An FP8 KV cache is quantized with scales fixed by the case (spec/fp8.py): v x 2 may saturate e4m3, so its
    rounds draw from FP8_TRANSFORMS (v and q, k times +-1): quantizing a transformed v gives the transformed
    quantized v bit for bit, and the new inputs still change the answer and the bytes of q, k or v."""
    import torch

    from harness.execution.integrity import FP8_TRANSFORMS
    from harness.spec import fp8

    assert FP8_TRANSFORMS and all(abs(t.v) == 1.0 and abs(t.qk) == 1.0 and (t.qk, t.v) != (1.0, 1.0)
                                  for t in FP8_TRANSFORMS)
    v = torch.randn(2, 2, 33, 16) * 300  # beyond e4m3's range at scale 1 too: saturation must stay symmetric
    scale = torch.ones(())
    for t in FP8_TRANSFORMS:
        assert torch.equal(fp8.quantize(v * t.v, scale).float(), fp8.quantize(v, scale).float() * t.v)
    for index in range(4):
        r = round_inputs(11, ("c", "b", "fwd"), index, fp8_kv=True)
        assert r.seen in FP8_TRANSFORMS and r.new in FP8_TRANSFORMS and r.new.factor("out") != r.seen.factor("out")


def _graph_round(work):
    """A round's checks on a call timed as a CUDA graph (run_timing swaps in the graph's Phase: its call a replay,
    renew a refill of the static inputs), on the CPU clock; `work(q, v)` is what the replay does."""
    from harness.execution.timed import Phase, _Checks
    from harness.measure.timing import Measurement

    inputs = make_inputs(CASE, "cpu", 3)
    buffers = {"q": inputs.q.clone(), "k": inputs.k.clone(), "v": inputs.v.clone()}

    def refill(new):
        for name, t in zip(("q", "k", "v"), new[:3]):
            buffers[name].copy_(t)

    def rehearse(new):
        import torch

        for name, t in zip(("q", "k", "v"), new[:3]):
            torch.empty_like(buffers[name]).copy_(t)

    phase = Phase(None, lambda: work(buffers["q"], buffers["v"]), None, buffers, refill, lambda value: (None, {}),
                  refill, rehearse)
    checks = _Checks(gamed.Recomputing(), phase, inputs, round_inputs(3, ("c", "b", "fwd"), 0))
    checks.renew()
    # what measure gave back: nine replays on seen inputs, the last (on new inputs) 250x slower
    return checks.finish(Measurement((0.1,) * 9 + (25.0,), "cuda-graph", 1), CPU)[1]


def test_a_graph_replay_on_new_inputs_far_slower_than_on_seen_ones_is_confirmed_then_rejected():
    """The speed rule applies to a CUDA graph's samples too (its last sample replays on new inputs): a replay
    that is fast only on contents it has seen is confirmed on three more new input sets, then rejected; a
    replay that costs the same on any inputs is not (the slow last sample was a stall)."""
    import time

    seen = set()

    def content_cache(q, v):
        key = (q.numpy().tobytes(), v.numpy().tobytes())
        if key not in seen:
            time.sleep(gamed.WORK_S)
            seen.add(key)

    assert _graph_round(content_cache).startswith("faster on inputs it has seen"), _graph_round(content_cache)
    assert _graph_round(lambda q, v: time.sleep(0.002)) == ""


def test_fp8_queries_round_inputs_are_exact_after_quantization():
    """An FP8 Q/K/V case's q is quantized too, per kv-head group (spec/fp8.py): q (and k) times -1 - the only change
    FP8_TRANSFORMS makes to them - commutes with e4m3 quantization bit for bit (its grid and saturation are
    symmetric), so the transformed round's quantized inputs are the verified ones' with flipped signs: the scores
    are unchanged and the answer follows exactly. The backend gets them through backend_inputs, as timing does."""
    import torch

    from harness import AttentionCase
    from harness.backends.naive import Naive
    from harness.execution.call import backend_inputs
    from harness.execution.integrity import FP8_TRANSFORMS
    from harness.spec.case import make_inputs

    case = AttentionCase(1, 6, 9, 16, "bf16", kv_heads=3, seq_k=12, fp8_kv="head", fp8_q=True)
    inputs = make_inputs(case)
    inputs = inputs._replace(q=inputs.q * 40)  # past e4m3's range for some values: saturation must stay symmetric
    base = backend_inputs(Naive(), case, inputs, requires_grad=False)
    assert base[0].dtype == torch.float8_e4m3fn
    for t in FP8_TRANSFORMS:
        q, k, v, _ = backend_inputs(Naive(), case, t.inputs(inputs), requires_grad=False)
        for got, verified, factor in ((q, base[0], t.qk), (k, base[1], t.qk), (v, base[2], t.v)):
            assert torch.equal(got.float(), verified.float() * factor)


def test_each_confirming_pair_starts_its_two_calls_after_the_same_work(monkeypatch):
    """The speed rule's confirming pairs: a call on new inputs after renew, then a call on the same inputs after
    rehearse - renew's work done into scratch - never a call straight after another. On a loaded 2-core VM an honest
    bf16 CPU call right after the new inputs' copies was 8-16x slower than its immediate repeat (naive fwd, sdpa-math
    bwd: three rejected keys in one default run, 2026-12-02) (likely its OpenMP threads waking); the old order
    (renew, call, call) rejected them."""
    import harness.execution.timed as timed_module
    from harness.execution.timed import Phase, _Checks

    monkeypatch.setattr(timed_module, "_once", lambda fn, device: (fn(), 1.0)[1])  # every call costs the same
    events = []
    inputs = make_inputs(CASE, "cpu", 3)
    phase = Phase(lambda: events.append("setup"), lambda: events.append("call"), None, {},
                  lambda new: events.append("renew"), lambda value: (None, {}), None,
                  lambda new: events.append("rehearse"))
    checks = _Checks(gamed.Recomputing(), phase, inputs, round_inputs(3, ("c", "b", "fwd"), 0))
    checks._confirm(CPU)
    # the calls cost the same on any inputs: the first pair is not slower on its new ones, and ends it
    assert events == ["renew", "setup", "call", "rehearse", "setup", "call"]


@pytest.mark.parametrize("phase", ["fwd", "bwd", "fwd+bwd"])
def test_rehearse_leaves_the_buffers_their_versions_and_the_backward_s_graph_as_the_last_call_saw_them(phase):
    """What a cache keyed by content, identity (data pointer and version) or graph sees before the confirming
    call on seen inputs is what it saw at the call before: rehearse writes scratch, not the buffers."""
    from harness.backends.naive import Naive
    from harness.execution.timed import phase_callables

    prepared = prepare_case(CASE, CPU, 5)
    timed = phase_callables(Naive(), CASE, prepared.inputs, CPU, phase)
    if timed.build is not None:
        timed.build()
    plan = round_inputs(5, (CASE.id, "naive", phase), 0)
    timed.renew(plan.confirm[0].inputs(prepared.inputs))
    before = {n: (t.data_ptr(), t._version, t.detach().clone()) for n, t in timed.buffers.items()}
    cells = [c.cell_contents for c in timed.fn.__closure__ or () if isinstance(c.cell_contents, list)]
    graph_before = [[id(out) for out in cell] for cell in cells]  # the backward alone: its built forward
    timed.rehearse(plan.confirm[0].inputs(prepared.inputs))
    for n, t in timed.buffers.items():
        ptr, version, value = before[n]
        assert (t.data_ptr(), t._version) == (ptr, version) and torch_equal(t, value), n
    assert [[id(out) for out in cell] for cell in cells] == graph_before


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a.detach(), b)


def test_a_lucky_repeat_beside_a_stalled_new_call_on_a_noisy_round_is_not_a_cache(monkeypatch):
    """An honest FP8 key on a loaded VM (one confirming pair): its round's calls on seen inputs took ~49 ms, the
    new call 10 ms, the pair's repeat 1.3 ms - 7.9x the repeat, but a fifth of the round's own median; rejected
    by the pairs alone (2026-12-02). A cache is fast on the round's calls too, and is still rejected."""
    import harness.execution.timed as timed_module
    from harness.measure.timing import Measurement

    phase = timed_module.Phase(None, lambda: None, None, {}, lambda new: None, lambda value: (None, {}), None,
                               lambda new: None)
    plan = RoundInputs(TRANSFORMS[0], TRANSFORMS[1], (TRANSFORMS[2],))
    for round_ms, expected in ((49.0, ""), (1.0, "faster on inputs it has seen")):
        pair = iter([10.0, 1.3])  # the confirming pair: the new call, then its repeat
        monkeypatch.setattr(timed_module, "_once", lambda fn, device: next(pair))
        checks = timed_module._Checks(gamed.Recomputing(), phase, make_inputs(CASE, "cpu", 3), plan)
        checks._renewed = True
        problem = checks.finish(Measurement((round_ms,) * 9 + (12.0,), "cpu-clock", 1), CPU)[1]
        assert problem.startswith(expected) if expected else problem == "", (round_ms, problem)


@pytest.mark.parametrize("fp8_kv", [False, True])
def test_a_round_has_up_to_six_confirming_sets_whose_content_no_other_call_had(fp8_kv):
    """An FP8 cache has three exact transforms, so one confirming pair used to be all it had; with v's (batch, kv
    head) slices the confirming sets are topped up to CONFIRM_CALLS by flipping one slice of seen's v (timed only,
    never judged: factor refuses them), each unlike every other call's inputs of the round."""
    import torch

    from harness.execution.integrity import CONFIRM_CALLS

    case = AttentionCase(2, 4, 8, 16, "fp32", kv_heads=2)
    inputs = make_inputs(case, "cpu", 1)
    for r in range(6):
        plan = round_inputs(9, ("k",), r, fp8_kv=fp8_kv, slices=case.batch * case.kv_heads)
        exact = [t for t in plan.confirm if t.flip is None]  # 4 (qk, v) pairs unlike seen's and new's; FP8: 1
        assert len(exact) == (1 if fp8_kv else 4)
        assert len(plan.confirm) == min(CONFIRM_CALLS, len(exact) + case.batch * case.kv_heads)
        sets = [t.inputs(inputs) for t in (plan.seen, plan.new, *plan.confirm)]
        for i, a in enumerate(sets):
            for b in sets[i + 1:]:
                assert not (torch.equal(a.q, b.q) and torch.equal(a.k, b.k) and torch.equal(a.v, b.v))
        flipped = [t for t in plan.confirm if t.flip is not None]
        assert flipped and all(pytest.raises(ValueError, t.factor, "out") for t in flipped)


def test_confirmation_ends_at_the_first_pair_not_slower_on_its_new_inputs(monkeypatch):
    """Every pair must be slower on its new inputs for a rejection, so an honest key's confirmation stops at its
    first even pair: a stall costs it one or two pairs, not six; a cache runs all six and is rejected. The pair that
    ends it clears the key even when its new call is slow beside the other pairs' repeats (a default run under load,
    2026-12-02, rejected honest naive keys so: a stalled repeat at 110 ms beside its new call at 300 ms)."""
    import harness.execution.timed as timed_module
    from harness.measure.timing import Measurement

    calls = []
    phase = timed_module.Phase(None, lambda: None, None, {}, lambda new: None, lambda value: (None, {}), None,
                               lambda new: None)
    plan = round_inputs(9, ("k",), 0, slices=CASE.batch * CASE.kv_heads)
    for pairs, expected_pairs, expected in (([(30.0, 1.0), (1.1, 1.0)], 2, ""),
                                            ([(200.0, 10.0), (300.0, 110.0)], 2, ""),
                                            ([(30.0, 1.0)] * 6, 6, "faster on inputs it has seen")):
        times = iter(t for pair in pairs for t in pair)
        calls.clear()
        monkeypatch.setattr(timed_module, "_once", lambda fn, device: calls.append(1) or next(times))
        checks = timed_module._Checks(gamed.Recomputing(), phase, make_inputs(CASE, "cpu", 3), plan)
        checks._renewed = True
        problem = checks.finish(Measurement((1.0,) * 9 + (30.0,), "cpu-clock", 1), CPU)[1]
        assert len(calls) == 2 * expected_pairs
        assert problem.startswith(expected) if expected else problem == ""


def test_a_seen_answer_that_is_the_new_one_scaled_bit_for_bit_is_judged_by_its_figures_else_on_its_own():
    """_scaled: an answer that is a judged one times the transforms' ratio bit for bit (a deterministic kernel's: the
    transforms are exact) gets the judged figures scaled, with no pass over the reference - the same figures a pass
    gives. judge_timed with answers not told scaled judges each: a nondeterministic one (within the
    tolerance) passes, one wrong on seen inputs alone fails."""
    import torch

    from harness.execution.benchmark import _judge_one, _scaled, judge_timed
    from harness.execution.timed import Observed

    prepared = prepare_case(CASE, CPU, 5)
    plan = round_inputs(5, (CASE.id, "sdpa", "fwd"), 0)
    verified = prepared.reference.out.to(torch.float32)
    new_out = verified * plan.new.factor("out")
    honest_seen = verified * plan.seen.factor("out")
    naive = prepared.naive_error("out", "sdpa")
    judged = _judge_one("out", honest_seen, plan.seen, prepared, naive)
    assert judge_timed(gamed.Recomputing(), prepared, "fwd",
                       [Observed(plan.seen, honest_seen), Observed(plan.new, new_out)]) == ""
    ratio = plan.seen.factor("out") / plan.new.factor("out")
    derived = _scaled(_judge_one("out", new_out, plan.new, prepared, naive), ratio, CASE.dtype,
                      naive * abs(plan.seen.factor("out")))
    assert (derived.err, derived.tol, derived.largest) == (judged.err, judged.tol,
                                                                                   judged.largest)
    jittered = honest_seen + 1e-7 * torch.randn_like(honest_seen)  # within the tolerance, not bitwise scaled
    assert judge_timed(gamed.Recomputing(), prepared, "fwd",
                       [Observed(plan.seen, jittered), Observed(plan.new, new_out)]) == ""
    wrong_seen = honest_seen.clone()
    wrong_seen.view(-1)[3] += 1.0
    problem = judge_timed(gamed.Recomputing(), prepared, "fwd",
                          [Observed(plan.seen, wrong_seen), Observed(plan.new, new_out)])
    assert problem.startswith("[fwd, a call on the round's inputs") and "out err" in problem


def test_where_the_calls_ran_a_seen_answer_scaled_from_the_last_is_dropped_and_judged_by_its_figures():
    """timed._drop_scaled (in the worker): an answer that is the kept verified one times its factor, or an earlier
    one that is the last one times the factors' ratio, bit for bit, does not travel; judge_timed gives it the
    verdict's Check or the last answer's, scaled - the figures a float64 pass gives. One that differs travels and is
    judged on its own - an answer wrong only on seen or only on new inputs still fails."""
    import torch

    from harness.execution.benchmark import _judge_one, judge_timed
    from harness.execution.timed import Observed, _drop_scaled

    prepared = prepare_case(CASE, CPU, 5)
    plan = round_inputs(5, (CASE.id, "sdpa", "fwd"), 0)
    verified = prepared.reference.out.to(torch.float32)
    observed = [Observed(plan.seen, verified * plan.seen.factor("out")),
                Observed(plan.new, verified * plan.new.factor("out"))]
    _drop_scaled(observed, {})
    assert observed[0].out is None and observed[0].scaled_last == {"out"}
    assert judge_timed(gamed.Recomputing(), prepared, "fwd", observed) == ""
    wrong = verified * plan.seen.factor("out")
    wrong.view(-1)[3] += 1.0
    observed = [Observed(plan.seen, wrong), Observed(plan.new, verified * plan.new.factor("out"))]
    _drop_scaled(observed, {})
    assert observed[0].out is not None and not observed[0].scaled_last
    assert judge_timed(gamed.Recomputing(), prepared, "fwd", observed).startswith("[fwd, a call on the round's inputs")

    # the verdict's answer kept where the calls ran: both answers are it, scaled - nothing travels
    naive = prepared.naive_error("out", "sdpa")
    check = _judge_one("out", verified, Transform(), prepared, naive)  # the verified inputs as they are
    observed = [Observed(plan.seen, verified * plan.seen.factor("out")),
                Observed(plan.new, verified * plan.new.factor("out"))]
    _drop_scaled(observed, {"out": verified})
    assert all(o.out is None and o.scaled_verified == {"out"} for o in observed)
    assert judge_timed(gamed.Recomputing(), prepared, "fwd", observed, {("no-grad", "out"): check}) == ""
    assert judge_timed(gamed.Recomputing(), prepared, "fwd", observed, {}).endswith("returned no out")
    bad = verified * 4.0  # the verdict's passed; 4x its answer is judged and fails, though both scaled bit for bit
    observed = [Observed(plan.seen, verified * plan.seen.factor("out")), Observed(plan.new, bad)]
    _drop_scaled(observed, {"out": verified})
    assert observed[0].out is None and observed[1].out is not None and not observed[1].scaled_verified
    assert judge_timed(gamed.Recomputing(), prepared, "fwd", observed,
                       {("no-grad", "out"): check}).startswith("[fwd, the last call, on new inputs")
