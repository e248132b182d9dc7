"""The clock a kernel cannot rewrite unseen (docs/integrity.md): timing reads clocks bound before any backend code ran,
and the run's own clock around each round audits the worker's (audit.clock_disagreement); planted plugins of
tests/fixtures/clock_plugin.py and harness_clock_plugin.py."""

import random
from pathlib import Path

import pytest

from harness import AttentionCase
from harness.run.benchmark import measure_phase
from harness.calls.device import resolve_device
from harness.run.audit import CLOCK_SHARE, CLOCK_SLACK_MS, clock_behind, clock_disagreement
from harness.run.rounds import Round
from harness.run.runner import execute, prepare_case
from harness.isolation.supervisor import IsolatedExecutor
from harness.measure.timing import TimingConfig
from harness.store.schema import NOT_TIMED, PHASES, REJECTED, TIMED
from tests.fixtures import gamed_kernels as gamed

CPU = resolve_device("cpu")
FIXTURES = Path(__file__).parents[2] / "fixtures"
CASE = AttentionCase(1, 2, 16, 32, "fp32")
FAST = TimingConfig(warmup_ms=2, budget_ms=10, min_reps=5, max_reps=20)


def _round(rng: random.Random, slow: float) -> tuple[float, float, float]:
    """(claimed, accounted, run's clock) of a synthetic round: timed and non-timed work of any size, a clock `slow`-fold
    slow, and the pipe's and scheduler's delay, heavy-tailed up to CLOCK_SLACK_MS (what a loaded VM showed)."""
    timed = 10 ** rng.uniform(0.5, 3.5)               # 3 ms .. 3 s of calls
    untimed = timed * rng.uniform(0.05, 3.0)          # warm-up, inputs, copies, judging
    delay = min(rng.expovariate(1 / 4.0), CLOCK_SLACK_MS)
    return timed / slow, (timed + untimed) / slow, timed + untimed + delay


def test_honest_rounds_under_seeded_scheduling_noise_are_never_rejected():
    rng = random.Random(47)
    assert not [r for r in (_round(rng, 1.0) for _ in range(20_000)) if clock_disagreement(*r)]


@pytest.mark.parametrize("slow", [2.0, 5.0, 20.0])
def test_a_slowed_clock_is_rejected_on_every_round_long_enough_for_its_factor(slow):
    """Rejected whenever (slow - 1 - CLOCK_SHARE) x the claimed round passes the slack: with a 5x clock, every round
    of at least 143 ms of real work, whatever the noise; with 2x, rounds of at least 400 ms (shorter ones: the lag
    their clock leaves, test_a_round_that_starts_before...)."""
    rng = random.Random(int(slow))
    rounds = [_round(rng, slow) for _ in range(5_000)]
    long_enough = [r for r in rounds if (slow - 1 - CLOCK_SHARE) * r[1] > CLOCK_SLACK_MS]
    assert long_enough and all(clock_disagreement(*r) for r in long_enough)


def test_samples_slowed_alone_show_as_time_nobody_accounted_for():
    """A plugin that rewrote only the clock the samples read (the work around them honest): 400 ms of calls claimed
    as 80 beside 40 ms of other work - the round accounts for 120 ms of the 440 the run saw."""
    assert "80 ms claimed in 400 ms of calls" in clock_disagreement(80.0, 40.0 + 80.0, 440.0)


def test_the_reason_gives_both_clocks_figures():
    reason = clock_disagreement(1.9, 3.0, 3.0 + 110.0)
    assert reason.startswith("the backend process's clock disagrees with the run's: 1.9 ms claimed in 112 ms of "
                             "calls"), reason
    assert clock_disagreement(1.9, 30.0, 30.0 + CLOCK_SHARE * 30 + CLOCK_SLACK_MS) == ""  # at the limit: not rejected


def test_a_round_that_starts_before_the_run_asked_for_it_is_a_clock_left_behind():
    assert clock_behind(started_ns=1_000, asked_ns=1_000) == ""
    assert clock_behind(started_ns=5_000_000, asked_ns=4_000_000) == ""
    assert clock_behind(started_ns=1_000_000, asked_ns=4_500_000) == (
        "the backend process's clock is behind the run's: the round started 3.5 ms before the run asked for it")


def _timed_in_worker(module: str, kernel, phase: str):
    executor = IsolatedExecutor(CPU, modules=(str(FIXTURES / module),), threads=1)
    try:
        prepared = prepare_case(CASE, CPU, 3)
        verdict = execute(kernel, prepared, executor=executor)
        assert verdict.status == "pass", verdict.reasons
        return [measure_phase(kernel, prepared, p, verdict, config=FAST, peaks={}, executor=executor,
                              timing_round=Round()).row for p in ([phase] if phase else PHASES)]
    finally:
        executor.close()


def test_clocks_slowed_at_import_leave_the_figures_as_the_calls_took():
    """The plugin slowed time.perf_counter(_ns) at import; the harness bound them before: a call that sleeps
    gamed.WORK_S in its forward is timed at no less (a slowed clock would say a fifth); its backward alone is timed."""
    for row in _timed_in_worker("clock_plugin.py", gamed.ClockAtImport(), ""):
        assert row.timing_status == TIMED, (row.phase, row.timing_reason)
        assert row.phase == "bwd" or row.latency_ms >= 1000 * gamed.WORK_S, (row.phase, row.latency_ms)


@pytest.mark.parametrize("module, kernel", [("harness_clock_plugin.py", gamed.HarnessClockAtImport),
                                            ("clock_plugin.py", gamed.ClockInForward),
                                            ("clock_plugin.py", gamed.QuarterEnd)])
def test_a_plugin_that_slows_the_harness_s_own_clock_gets_no_figure(module, kernel):
    """QuarterEnd reads only each sample's end early (a quarter of the call), so its round's totals add up: the run's
    clocks around each call (isolation/brackets.py, audit.bracket_audit) see the rest - rejected; on a machine so
    loaded that its CPU time is about its reading, its main thread waiting for a CPU the rest, it is at least not
    auditable (no figure: before 2026-12-07 it passed at load 11). Its backward alone (sdpa's, never armed) games
    nothing and is timed."""
    for row in _timed_in_worker(module, kernel(), ""):
        if kernel is gamed.QuarterEnd and row.phase == "bwd":
            assert row.timing_status == TIMED, row.timing_reason
            continue
        loaded = kernel is gamed.QuarterEnd and row.timing_status == NOT_TIMED and "at this load" in row.timing_reason
        assert (row.timing_status == REJECTED or loaded) and row.latency_ms is None, (row.phase, row.timing_reason)
        assert "the backend process's clock" in row.timing_reason


def test_the_run_s_clock_stops_as_the_reply_arrives_not_after_reading_it(monkeypatch):
    """supervisor.Worker.ask (child.Child.receive): the round by the run's clock ends when the reply is there to read. Reading it
    (a large answer's trips to the worker's fd sharer, the restricted unpickler) is this process's work, which a
    loaded machine slows: the round's wall ends before a read (here one taking 300 ms) starts - by the clocks'
    readings alone, so no load on the machine moves the verdict."""
    import time

    from harness.backends.registry import get_backends
    from harness.isolation import child
    from harness.calls.call import Call
    from harness.calls.timed import TimingCall

    real, reads = child.Channel.recv, []

    def slow_read(channel):
        reads.append(time.perf_counter_ns())  # the clock child.CLOCKS binds
        answer = real(channel)
        time.sleep(0.3)
        return answer

    monkeypatch.setattr(child.Channel, "recv", slow_read)
    executor = IsolatedExecutor(CPU)
    try:
        answer = executor.time(get_backends(["naive"])[0], TimingCall(Call(CASE, 3), "fwd", FAST), CPU)
    finally:
        executor.close()
    assert answer.failure is None
    read_ms = (reads[-1] - answer.asked_ns) / 1e6  # the read began this long after the request
    assert answer.wall_ms <= read_ms + 1e-3, (answer.wall_ms, read_ms)


@pytest.mark.parametrize("walls, kept, rejected", [
    ([500.0, 500.0, 20.0], 3, False),  # held up twice by the scheduler, then agreeing: that round's figure is kept
    ([500.0, 500.0, 500.0], 3, True),  # a slowed clock disagrees on every round: rejected after CLOCK_TRIES
    ([20.0], 1, False),
])
def test_a_disagreeing_round_is_timed_again_and_only_an_agreeing_round_s_figure_is_kept(walls, kept, rejected):
    """audit.audited_time: up to CLOCK_TRIES rounds; the answer returned is the last one timed."""
    from types import SimpleNamespace

    from harness.calls.call import Call
    from harness.calls.timed import TimingCall
    from harness.run.audit import CLOCK_TRIES, audited_time

    assert CLOCK_TRIES == 3
    asked = []

    class Executor:
        def time(self, backend, timing, device):
            asked.append(timing.seed)
            measurement = SimpleNamespace(samples_ms=(5.0,), event_vs_host=None)
            return SimpleNamespace(failure=None, measurement=measurement, accounted_ms=10.0, witness=None,
                                   wall_ms=walls[len(asked) - 1], started_ns=1, asked_ns=0, index=len(asked))

    timing = TimingCall(Call(CASE, 3), "fwd", FAST)
    answer, clock = audited_time(Executor(), None, timing, CPU)
    assert len(asked) == kept and answer.index == kept and bool(clock.problem) == rejected and not clock.loaded
    assert len(set(asked)) == kept and asked[0] == timing.seed and answer.seed == asked[-1]  # a retry: new contents


def test_a_round_unauditable_by_its_brackets_is_still_rejected_by_any_other_check(monkeypatch):
    """audit.clock_audit: the bracket rule's `loaded` (a pool's spin beside other load) explains the brackets alone -
    a round whose clock also disagrees with the run's around it is rejected, not left unauditable."""
    from types import SimpleNamespace

    from harness.run import audit

    loaded = audit.Audit("spun: not auditable at this load", loaded=True)
    monkeypatch.setattr(audit, "bracket_problem", lambda *a: loaded)
    measurement = SimpleNamespace(samples_ms=(5.0,), event_vs_host=None)
    answer = SimpleNamespace(measurement=measurement, accounted_ms=10.0, witness=SimpleNamespace(brackets=(), threads=2),
                             started_ns=1, asked_ns=0)
    assert audit.clock_audit(SimpleNamespace(**vars(answer), wall_ms=20.0)) == loaded
    disagrees = audit.clock_audit(SimpleNamespace(**vars(answer), wall_ms=500.0))
    assert disagrees.problem.startswith("the backend process's clock disagrees") and not disagrees.loaded


def test_an_unchecked_round_is_not_bracketed():
    """TimingCall(checked=False) (integrity_overhead's baseline): no content, no checks - and no bracket, so a
    worker's ticker is never touched (its first word would be a report the run never asked for)."""
    from harness.backends.naive import Naive
    from harness.calls.call import Call
    from harness.calls.timed import TimingCall, run_timing

    class Ticker:
        def __getattr__(self, name):
            raise AssertionError(f"an unchecked round used the ticker's {name}")

    result = run_timing(Naive(), TimingCall(Call(CASE, 3), "fwd", FAST, checked=False), CPU, ticker=Ticker())
    assert result.failure is None and result.observed == [] and result.measurement.n >= FAST.min_reps
