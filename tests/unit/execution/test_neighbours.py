"""An equal machine for every timed backend (isolation/neighbours.py, docs/integrity.md): the others stopped while one
is timed, its placement set by the run and checked, its CPU time held to its threads; with the planted neighbours of
tests/fixtures/neighbour_plugin.py."""

import multiprocessing as mp
import os
import shutil
import time
from pathlib import Path

import pytest

from harness import AttentionCase
from harness.backends.registry import get_backends
from harness.calls.call import Call
from harness.calls.device import resolve_device
from harness.isolation.neighbours import (CPU_SHARE, CPU_SLACK_MS, EqualMachine, Placement, cpu_seconds, misplaced,
                                          over_threads, place, resume, stop)
from harness.isolation.supervisor import IsolatedExecutor
from harness.calls.timed import TimingCall
from harness.measure.timing import TimingConfig

CPU = resolve_device("cpu")
FIXTURES = Path(__file__).parents[2] / "fixtures"
linux = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity") else True,
                              reason="needs two CPUs to move a thread between")


@pytest.mark.parametrize("cpu_s, wall_s, threads, rejected", [
    (0.10, 0.10, 1, False),
    (CPU_SHARE * 0.2 + CPU_SLACK_MS / 1e3, 0.2, 1, False),          # at the limit
    (CPU_SHARE * 0.2 + CPU_SLACK_MS / 1e3 + 0.011, 0.2, 1, True),   # a tick over it
    (0.39, 0.2, 2, False),
    (0.40, 0.2, 1, True),                                           # two CPUs' work on one thread's allowance
    (0.02, 0.001, 1, False),                                        # a tick's granularity on a short round
])
def test_a_round_may_take_its_threads_cpu_time_and_no_more(cpu_s, wall_s, threads, rejected):
    """The decision alone, on figures: a real call's use of extra CPUs shows only when the machine has them free,
    which a shared test machine does not promise."""
    reason = over_threads(cpu_s, wall_s, threads)
    assert bool(reason) == rejected, reason
    assert not rejected or f"on {threads} thread(s)" in reason


def _spin(counter) -> None:
    while True:  # no lock: one held by a stopped process would hold the test up too
        counter.value += 1


def _moves(counter, held: int, within_s: float = 10.0) -> bool:
    """Whether the counter passes `held` within `within_s` (a loaded machine may take a while to schedule it)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if counter.value > held:
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def spinner():
    """(a child process counting as fast as it can, its counter), killed afterwards."""
    ctx = mp.get_context("fork")
    counter = ctx.RawValue("q", 0)
    child = ctx.Process(target=_spin, args=(counter,), daemon=True)
    child.start()
    while counter.value == 0:
        time.sleep(0.01)
    yield child, counter
    child.kill()
    child.join()


@linux
def test_a_stopped_process_makes_no_progress_until_resumed(spinner):
    child, counter = spinner
    assert stop([child.pid]) == [child.pid]
    time.sleep(0.05)  # a SIGSTOP is delivered before the next time slice; let one pass
    held = counter.value
    time.sleep(0.2)
    assert counter.value == held
    resume([child.pid])
    assert _moves(counter, held)


@linux
@two_cpus
def test_a_thread_moved_off_the_run_s_cpus_is_named_and_put_back():
    ctx = mp.get_context("fork")
    child = ctx.Process(target=time.sleep, args=(30,), daemon=True)
    child.start()
    try:
        placement = Placement.of_run()
        assert misplaced(child.pid, placement) == ""
        one = {min(placement.cpus)}
        os.sched_setaffinity(child.pid, one)
        assert f"was moved to CPU(s) {min(one)} (the run placed it on" in misplaced(child.pid, placement)
        place(child.pid, placement)
        assert misplaced(child.pid, placement) == ""
    finally:
        child.kill()
        child.join()


@linux
def test_cpu_time_is_the_kernel_s_count_of_every_thread():
    before = cpu_seconds(os.getpid())
    end = time.process_time() + 0.1
    while time.process_time() < end:
        pass
    assert cpu_seconds(os.getpid()) - before >= 0.08
    assert cpu_seconds(2 ** 22 + 7) is None  # no such process


@linux
def test_the_equal_machine_resumes_the_others_even_when_the_round_raises(spinner):
    child, counter = spinner
    with pytest.raises(RuntimeError):
        with EqualMachine(os.getpid(), [child.pid], Placement.of_run(), threads=1):
            raise RuntimeError("the round failed")
    assert _moves(counter, counter.value)


CASE = AttentionCase(4, 4, 256, 64, "fp32")
FIXTURE = FIXTURES / "neighbour_plugin.py"


@pytest.fixture
def neighbours(tmp_path):
    """The neighbour plugin copied into tmp_path, beside an empty log when `repinning` (its thread runs only then),
    declared from its own process; afterwards its process is stopped and its stand-ins unregistered."""
    from harness.backends import registry
    from harness.isolation import plugin_host

    loaded = []

    def load(repinning: bool) -> Path:
        path = tmp_path / FIXTURE.name
        shutil.copy(FIXTURE, path)
        if repinning:
            path.with_suffix(".log").write_text("")
        loaded.append(plugin_host.load_backend_module(str(path)))
        return path.with_suffix(".log")

    yield load
    for host in loaded:
        host.close()
        plugin_host._HOSTS.pop(host.spec, None)
        registry._REGISTRY.pop("gamed-repinner", None)
        registry._ORIGIN.pop("gamed-repinner", None)
        registry._LOADED.remove(host.spec)


def _time(executor, name: str, phase: str = "fwd", budget_ms: float = 60.0):
    config = TimingConfig(warmup_ms=budget_ms / 4, budget_ms=budget_ms, min_reps=5, max_reps=200)
    return executor.time(get_backends([name])[0], TimingCall(Call(CASE, 3), phase, config), CPU)


@linux
@two_cpus
def test_a_neighbour_that_repins_and_spins_never_runs_while_another_backend_is_timed(neighbours):
    """gamed-repinner's thread pins every sibling worker's threads to one CPU and spins, every millisecond, from its
    worker and from its module's declaring process. While naive is timed both are stopped: none of its passes falls
    inside naive's rounds (by the run's clock), and naive's rounds are placed anew and stand (not rejected)."""
    log = neighbours(repinning=True)
    executor = IsolatedExecutor(CPU, threads=1)
    try:
        assert _time(executor, "gamed-repinner").failure is None  # its worker (and thread) running
        rounds = []
        for _ in range(3):
            answer = _time(executor, "naive")
            assert answer.failure is None and answer.integrity == "", answer.integrity
            rounds.append((answer.asked_ns, answer.asked_ns + answer.wall_ms * 1e6))
            assert answer.others_share is not None and 0 <= answer.others_share <= 1
    finally:
        executor.close()
    passes = [(int(t), int(n)) for t, n in (line.split() for line in log.read_text().split("\n") if line)]
    assert any(n > 0 for _, n in passes), "the neighbour found no sibling to pin: the test shows nothing"
    # time.monotonic_ns and the run's perf_counter_ns read one clock on Linux (CLOCK_MONOTONIC); a pass written as
    # the stop arrived may land a moment after the round began
    inside = [t for t, _ in passes for a, b in rounds if a + 5e6 < t < b - 1e6]
    assert not inside, f"{len(inside)} pass(es) of the neighbour ran while naive was timed"
