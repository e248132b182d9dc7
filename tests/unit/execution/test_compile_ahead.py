"""Compile-ahead (execution/compile_ahead.py): a second worker of a backend runs the run's correctness calls from
the last backwards, skips what the run has reached, and is stopped before anything is timed (CPU, real workers)."""

import time

import torch

from harness.backends.registry import get_backends
from harness.execution.call import Call
from harness.execution.isolation import IsolatedExecutor
from harness.execution.timed import TimingCall
from harness.measure.stages import CLOCK
from harness.measure.timing import TimingConfig
from harness.spec.case import AttentionCase

CPU = torch.device("cpu")
CASES = [AttentionCase(1, 2, s, 8, "fp32") for s in (8, 9, 10)]


def _wait(ahead, seconds: float = 60.0) -> None:
    ahead._thread.join(timeout=seconds)
    assert not ahead._thread.is_alive(), "the compile-ahead did not end"


def test_it_runs_the_calls_last_to_first_and_meets_the_run():
    executor = IsolatedExecutor(CPU)
    naive = get_backends(["naive"])[0]
    CLOCK.reset()
    try:
        executor.compile_ahead(naive, [Call(c, 0) for c in CASES])
        executor.call(naive, Call(CASES[0], 0), CPU)  # the run reaches the first case: the compile-ahead skips it
        ahead = executor.ahead["naive"]
        _wait(ahead)
        assert ahead.done == [CASES[2].id, CASES[1].id]
        assert executor.compiled_ahead()["naive"]["ended"] == "met the run"
        assert CLOCK.snapshot()["forward"][1] == 1  # its calls ran beside the run: off the run's stage clock
    finally:
        executor.close()


def test_timing_stops_it_first():
    executor = IsolatedExecutor(CPU)
    naive = get_backends(["naive"])[0]
    try:
        slow = [Call(AttentionCase(1, 4, 1024 + i, 64, "fp32"), 0) for i in range(200)]  # far more than the test
        executor.compile_ahead(naive, slow)
        ahead = executor.ahead["naive"]
        deadline = time.monotonic() + 60
        while not ahead.done and time.monotonic() < deadline:  # it is running calls
            time.sleep(0.1)
        result = executor.time(naive, TimingCall(Call(CASES[0], 0), "fwd", TimingConfig(1, 2, 3, 5)), CPU)
        assert result.failure is None and not ahead._thread.is_alive()
        assert not ahead._worker.process.is_alive()
        assert executor.compiled_ahead()["naive"]["ended"] == "stopped by the run (timing started)"
    finally:
        executor.close()


def _untimed_task(backend, device):
    return backend.name


def test_a_task_that_times_stops_it_and_one_that_times_nothing_does_not():
    """The empty-tensor probes run as tasks (executor.run) while the compile-ahead fills the cache for correctness:
    run(times=False) leaves it going; a task that may time (the fidelity check) stops it."""
    executor = IsolatedExecutor(CPU)
    naive = get_backends(["naive"])[0]
    try:
        slow = [Call(AttentionCase(1, 4, 1024 + i, 64, "fp32"), 0) for i in range(200)]
        executor.compile_ahead(naive, slow)
        ahead = executor.ahead["naive"]
        assert executor.run(naive, _untimed_task, CPU, times=False) == "naive"
        assert ahead._thread.is_alive()
        assert executor.run(naive, _untimed_task, CPU) == "naive"
        assert not ahead._thread.is_alive()
    finally:
        executor.close()


def test_in_process_nothing_runs_beside_the_run():
    from harness.execution.executor import Executor

    executor = Executor()
    executor.compile_ahead(get_backends(["naive"])[0], [Call(CASES[0], 0)])
    assert executor.compiled_ahead() == {}
