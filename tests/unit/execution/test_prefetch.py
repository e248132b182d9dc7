"""harness.run.prefetch: the session's prefetcher runs the correctness calls of a backend that compiles per
shape from the last back, skips what the run claimed, meets the run, and stops (waiting for the call in hand)
before the first timing round."""

import time

import torch

from harness.backends.base import Backend
from harness.backends.naive import Naive
from harness.calls.call import Call
from harness.isolation.executor import make_executor
from harness.run.prefetch import Prefetcher
from harness.run.session import RunSession
from harness.cases.case import AttentionCase

CPU = torch.device("cpu")
NAME = "compiles-per-shape-probe"
CASES = [AttentionCase(1, 2, n, 8, "fp32") for n in (8, 9, 10, 11)]


def _module(tmp_path, delay_s: float):
    """A plugin module for the worker: a naive backend that compiles per shape and logs each call's sequence."""
    log = tmp_path / "calls.txt"
    module = tmp_path / "per_shape_probe.py"
    module.write_text(
        "import time\nimport torch\nfrom harness.backends.naive import Naive\n"
        "from harness.backends.registry import register\n\n"
        "@register\nclass PerShape(Naive):\n"
        f"    name = {NAME!r}\n    compiles_per_shape = True\n\n"
        "    def forward(self, q, k, v, **kw):\n"
        f"        open({str(log)!r}, 'a').write(f'{{q.shape[2]}} {{torch.get_num_threads()}}\\n')\n"
        f"        time.sleep({delay_s})\n"
        "        return super().forward(q, k, v, **kw)\n")
    stand_in = type("PerShape", (Backend,), {"name": NAME, "compiles_per_shape": True})()
    return str(module), log, stand_in


def _seen(log) -> list[int]:
    """The sequence length of each call the worker made."""
    return [int(line.split()[0]) for line in log.read_text().splitlines()] if log.exists() else []


def _until(predicate, timeout_s: float = 120.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_it_runs_the_calls_last_to_first_skipping_what_the_run_claimed(tmp_path):
    module, log, backend = _module(tmp_path, 0.0)
    calls = [(backend, Call(c, 0)) for c in CASES]
    prefetcher = Prefetcher(calls, CPU, str(tmp_path / "workers"), modules=(module,))
    prefetcher.claim(backend, CASES[0])  # the run is on the first case already
    _until(lambda: prefetcher.ended != "")
    prefetcher.stop()
    assert _seen(log) == [11, 10, 9]
    # the run's thread count: inductor writes it into the CPU kernels, so with another none would be a cache hit
    assert {int(line.split()[1]) for line in log.read_text().splitlines()} == {torch.get_num_threads()}
    assert prefetcher.summary()["calls"] == 3 and prefetcher.ended == "met the run"
    assert (tmp_path / "workers" / "prefetch" / f"{NAME}.log").exists()  # its worker's output has its own folder


def test_stop_waits_for_the_call_in_hand_and_starts_no_other(tmp_path):
    module, log, backend = _module(tmp_path, 1.0)
    prefetcher = Prefetcher([(backend, Call(c, 0)) for c in CASES], CPU, modules=(module,))
    _until(lambda: len(_seen(log)) == 1)  # the first call is running
    prefetcher.stop()
    assert _seen(log) == [11] and prefetcher.done == [f"{NAME}:{CASES[-1].id}"]
    assert prefetcher.ended == "stopped before timing"


def test_a_worker_that_cannot_start_ends_it_with_the_reason(tmp_path):
    ghost = type("Ghost", (Backend,), {"name": "not-in-the-worker", "compiles_per_shape": True})()
    prefetcher = Prefetcher([(ghost, Call(CASES[0], 0))], CPU, modules=())
    _until(lambda: prefetcher.ended != "")  # a stop before its first call would end it "stopped before timing"
    prefetcher.stop()
    assert "the worker of not-in-the-worker could not start" in prefetcher.ended and prefetcher.done == []


def test_the_session_prefetches_only_what_compiles_per_shape_and_stops_it_before_its_first_timing(tmp_path,
                                                                                               monkeypatch):
    from harness.backends import registry

    module, log, backend = _module(tmp_path, 1.0)
    monkeypatch.setitem(registry._ORIGIN, NAME, module)  # what a run's --backend-module records: its worker loads it
    session = RunSession(CPU, tmp_path)
    session.compile_ahead([(c, backend) for c in CASES])
    assert session.prefetcher is None  # calls kept in this process (--no-isolate): no process beside them
    session = RunSession(CPU, tmp_path, executor=make_executor(CPU, isolate=True, modules=()))
    session.compile_ahead([(c, Naive()) for c in CASES])
    assert session.prefetcher is None  # naive compiles nothing
    naive, case = Naive(), CASES[0]
    verdict = session.verdict(case, naive)  # before: the round below must follow the first prefetched call at once
    session.compile_ahead([(c, backend) for c in CASES])
    _until(lambda: len(_seen(log)) == 1)
    session.benchmark_round(case, naive, "fwd", 0, verdict)
    assert session.env["prefetch"]["ended"] == "stopped before timing" and session.prefetcher is None
    assert set(_seen(log)) == {11}  # the call in hand (its no-grad and grad forwards), nothing beside the timing
    session.compile_ahead([(c, backend) for c in CASES])
    assert session.prefetcher is None  # a run that has timed starts none again
    session.finish()


def test_entering_the_benchmark_stage_stops_it_before_any_of_its_tests(tmp_path, monkeypatch):
    """The timing-fidelity test times through the executor, not benchmark_round: the stage itself stops it."""
    from harness.backends import registry

    module, log, backend = _module(tmp_path, 1.0)
    monkeypatch.setitem(registry._ORIGIN, NAME, module)
    session = RunSession(CPU, tmp_path, executor=make_executor(CPU, isolate=True, modules=()))
    session.compile_ahead([(c, backend) for c in CASES])
    _until(lambda: len(_seen(log)) >= 1)
    session.enter_stage("correctness")
    assert session.prefetcher is not None  # the probes and correctness leave it going
    session.enter_stage("benchmark")
    assert session.prefetcher is None and session.env["prefetch"]["ended"] == "stopped before timing"
    assert session.env["stage"] == "benchmark"
    session.finish()
