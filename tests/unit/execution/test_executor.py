"""The in-process executor: a KeyboardInterrupt inside a backend stops that `harness.check` call once its row is
written, and never a later call in the same process (it was a module singleton whose flag was never reset)."""

import pytest
import torch

import harness
from harness.backends.base import Backend
from harness.execution.executor import Executor
from harness.execution.session import RunSession
from harness.spec.case import AttentionCase

CASES = [AttentionCase(1, 2, 8, 8, "fp32")]


class Interrupts(Backend):
    name = "interrupts"

    def forward(self, q, k, v, *, mask, scale):
        raise KeyboardInterrupt


def test_an_interrupt_stops_its_own_check_and_not_the_next():
    with pytest.raises(KeyboardInterrupt, match="interrupts raised KeyboardInterrupt"):
        harness.check([Interrupts(), "naive"], CASES, "cpu")
    try:
        df = harness.check(["naive", "sdpa-math"], CASES, "cpu")
    except KeyboardInterrupt as exc:  # the old sticky flag: stopped after its first backend
        pytest.fail(f"a later check stopped on the earlier interrupt: {exc}")
    assert sorted(set(df.backend)) == ["naive", "sdpa-math"] and set(df.status) == {"pass"} and len(df) == 4


def test_every_session_gets_its_own_in_process_executor(tmp_path):
    a, b = (RunSession(torch.device("cpu"), tmp_path / name) for name in "ab")
    assert isinstance(a.executor, Executor) and a.executor is not b.executor


def test_an_unavailable_backend_is_refused_as_unavailable_with_its_reason():
    from harness.backends.naive import Naive
    from harness.execution.runner import refusal

    class Absent(Naive):
        name = "absent"

        def unavailable_reason(self, device):
            return "absent: not installed"

    assert refusal(Absent(), AttentionCase(1, 2, 8, 8, "fp32"), torch.device("cpu"), Executor()) == (
        "unavailable", "absent: not installed")
