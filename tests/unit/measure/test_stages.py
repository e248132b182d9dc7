"""The stage clock: stages partition the time they cover, a worker's stages come back with its reply, and a run
records where its time went in env.json."""

from __future__ import annotations

import json

import pytest
import torch

from harness import AttentionCase
from harness.backends.naive import Naive
from harness.isolation.supervisor import IsolatedExecutor
from harness.run.runner import execute, prepare_case
from harness.run.session import RunSession
from harness.measure import stages
from harness.measure.stages import StageClock, time_lines
from harness.cases.masks import Causal

CPU = torch.device("cpu")


class FakeTime:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


def test_nested_stages_are_charged_exclusive_time(fake_time):
    clock = StageClock(now=fake_time)
    with clock.stage("call"):
        fake_time.now += 1.0
        with clock.stage("forward"):
            fake_time.now += 5.0
        with clock.stage("answers copied"):
            fake_time.now += 2.0
            with clock.stage("forward"):  # nested twice: still exclusive
                fake_time.now += 0.5
        fake_time.now += 0.25
    assert clock.snapshot() == {"call": (1.25, 1), "forward": (5.5, 2), "answers copied": (2.0, 1)}
    assert sum(s for s, _ in clock.snapshot().values()) == fake_time.now  # a partition of the 8.75 s


def test_merged_worker_time_is_taken_out_of_the_open_stage(fake_time):
    clock = StageClock(now=fake_time)
    with clock.stage("worker pipe"):
        fake_time.now += 10.0  # the round trip
        clock.merge({"forward": (7.0, 1), "worker: call": (0.5, 1)})  # what the worker says it spent
    assert clock.snapshot() == {"worker pipe": (2.5, 1), "forward": (7.0, 1), "worker: call": (0.5, 1)}


def test_since_reports_only_what_a_request_added(fake_time):
    clock = StageClock(now=fake_time)
    with clock.stage("forward"):
        fake_time.now += 1.0
    before = clock.snapshot()
    with clock.stage("forward"):
        fake_time.now += 3.0
    with clock.stage("backward"):
        fake_time.now += 2.0
    assert clock.since(before) == {"forward": (3.0, 1), "backward": (2.0, 1)}


def test_an_exception_still_charges_the_stage(fake_time):
    clock = StageClock(now=fake_time)
    with pytest.raises(RuntimeError):
        with clock.stage("forward"):
            fake_time.now += 4.0
            raise RuntimeError("kernel refused")
    assert clock.snapshot() == {"forward": (4.0, 1)}


def test_time_lines_name_the_largest_stages_and_the_rest():
    spent = {"wall_s": 100.0, "tests_s": {"correctness": 60.0, "benchmark": 35.0},
             "stages": {"forward": {"s": 40.0, "n": 22}, "judging": {"s": 10.0, "n": 88},
                        "reference": {"s": 20.0, "n": 11}, "answers copied": {"s": 1.0, "n": 44}}}
    first, second = time_lines(spent, top=2)
    assert first == "time: 100 s (correctness 60 s, benchmark 35 s)"
    assert second == ("  by stage: forward 40.0 s (22), reference 20.0 s (11), 2 more 11.0 s, "
                      "outside these 29.0 s")


def test_a_worker_call_brings_its_stages_back(tmp_path):
    stages.STAGE_CLOCK.reset()
    executor = IsolatedExecutor(CPU, modules=(), log_dir=str(tmp_path / "workers"))
    case = AttentionCase(1, 2, 16, 8, "fp32", mask=Causal())
    try:
        execute(Naive(), prepare_case(case, CPU), executor=executor)
    finally:
        executor.close()
    spent = stages.STAGE_CLOCK.snapshot()
    # here: the reference, the worker's start and pipe, judging; there: the call's own stages
    for name in ("reference", "naive baseline", "worker start", "worker pipe", "judging", "inputs", "prepare",
                 "forward", "backward", "answers copied", "worker: call", "worker: available"):
        assert name in spent, f"{name} missing from {sorted(spent)}"
    # two forwards (the no-grad call inference makes, then the training call); out twice, dq, dk, dv
    assert spent["forward"][1] == 2 and spent["backward"][1] == 1 and spent["answers copied"][1] == 5


def test_a_session_records_where_its_time_went(tmp_path):
    session = RunSession(CPU, tmp_path)
    case = AttentionCase(1, 2, 16, 8, "fp32")
    session.check(case, Naive())
    session.recorder.add_test_seconds("correctness", 1.5)
    session.finish()
    spent = json.loads((session.run_dir / "env.json").read_text())["time_spent"]
    assert spent["tests_s"] == {"correctness": 1.5} and spent["wall_s"] > 0
    assert {"reference", "forward", "judging"} <= set(spent["stages"])
    assert sum(v["s"] for v in spent["stages"].values()) <= spent["wall_s"]
    assert spent["counts"] == {"checked": 1} and spent["round_budget_ms"] == 125.0
    assert stages.time_lines(spent)[-1] == "  per unit: a case and backend checked 1.50 s (1)"


def test_a_key_s_round_is_stated_against_its_budget():
    """What issue 63 targets on a GPU: a timed key's wall against its budget, a case and backend's correctness."""
    spent = {"wall_s": 100.0, "tests_s": {"correctness": 12.0, "benchmark": 75.0}, "stages": {},
             "counts": {"checked": 40, "timed rounds": 300}, "round_budget_ms": 125.0}
    assert stages.unit_costs(spent) == ("  per unit: a key's round 0.25 s, 2.0x its budget of 125 ms (300 rounds); "
                                        "a case and backend checked 0.30 s (40)")
    assert stages.unit_costs({"wall_s": 1.0, "tests_s": {"benchmark": 1.0}, "stages": {}}) == ""  # an older env.json


def test_a_round_s_samples_are_charged_apart_from_its_loop():
    from harness.calls.call import Call
    from harness.calls.timed import TimingCall, run_timing
    from harness.measure.timing import TimingConfig
    stages.STAGE_CLOCK.reset()
    case = AttentionCase(1, 2, 16, 8, "fp32")
    result = run_timing(Naive(), TimingCall(Call(case), "fwd", TimingConfig(warmup_ms=1, budget_ms=5)), CPU)
    spent = stages.STAGE_CLOCK.snapshot()
    assert spent[stages.TIMED_CALLS] == (pytest.approx(sum(result.measurement.samples_ms) / 1e3),
                                         len(result.measurement.samples_ms))
    assert "timing" in spent
