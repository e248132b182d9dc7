"""The executors: one protocol, two implementations made by one factory, no shared state (issue 33); and a
KeyboardInterrupt inside a backend stops that `harness.check` call once its row is written, and never a later call in
the same process (it was a module singleton whose flag was never reset)."""

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
import torch

import harness
from harness.backends.base import Backend
from harness.isolation.executor import Executor, make_executor
from harness.isolation.in_process import InProcessExecutor
from harness.isolation.supervisor import IsolatedExecutor
from harness.run.session import RunSession
from harness.cases.case import AttentionCase

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
    assert isinstance(a.executor, InProcessExecutor) and a.executor is not b.executor


def test_an_unavailable_backend_is_refused_as_unavailable_with_its_reason():
    from harness.backends.naive import Naive
    from harness.run.runner import refusal

    class Absent(Naive):
        name = "absent"

        def unavailable_reason(self, device):
            return "absent: not installed"

    assert refusal(Absent(), AttentionCase(1, 2, 8, 8, "fp32"), torch.device("cpu"), InProcessExecutor()) == (
        "unavailable", "absent: not installed")


PROTOCOL = [name for name, member in vars(Executor).items() if callable(member) and not name.startswith("_")]


@pytest.mark.parametrize("impl", [InProcessExecutor, IsolatedExecutor])
def test_both_executors_implement_the_protocol_with_its_signatures(impl):
    assert set(PROTOCOL) == {"unavailable_reason", "refusal", "call", "time", "run", "worker_restarts", "close"}
    for name in PROTOCOL:
        assert list(inspect.signature(getattr(impl, name)).parameters) == \
            list(inspect.signature(getattr(Executor, name)).parameters), (impl.__name__, name)
    assert isinstance(impl.isolated, bool)


def test_the_factory_makes_both_and_each_executor_has_its_own_state(tmp_path):
    cpu = torch.device("cpu")
    here, there = make_executor(), make_executor(cpu, isolate=True, timeout_s=40.0, timeouts=(("bf16-*", 900.0),),
                                                  log_dir=str(tmp_path), modules=())
    try:
        assert type(here) is InProcessExecutor and type(there) is IsolatedExecutor
        assert (there.timeout_s, there.timeouts, there.log_dir, there.device) == (40.0, (("bf16-*", 900.0),),
                                                                                 str(tmp_path), cpu)
        # `interrupted` is the instance's own (it was a class attribute set per instance)
        for executor, other in ((here, make_executor()), (there, make_executor(cpu, isolate=True, modules=()))):
            assert "interrupted" not in type(executor).__dict__ and executor.interrupted is None
            executor.interrupted = "x raised KeyboardInterrupt inside a call"
            assert other.interrupted is None
            other.close()
        assert not dataclasses.is_dataclass(IsolatedExecutor)  # its own __init__, nothing inherited unrun
        assert there.workers == {} and there.worker_restarts() == {}
    finally:
        there.close()
    with pytest.raises(ValueError, match=r"make_executor\(isolate=True\) needs the device"):
        make_executor(isolate=True)


def test_no_module_holds_an_executor_instance():
    """No module-level executor (it was `IN_PROCESS = Executor()`, a stateful default in 16 signatures): every
    executor is made by make_executor for a run, a call or a session."""
    makers = {"make_executor", "InProcessExecutor", "IsolatedExecutor"}
    offenders = []
    for path in (Path(harness.__file__).parent).rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            value = getattr(node, "value", None) if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) in makers:
                offenders.append(f"{path.name}: {ast.unparse(node)}")
        for node in ast.walk(tree):  # a default argument that builds an executor is one shared instance too
            if isinstance(node, ast.FunctionDef):
                for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
                    if isinstance(default, ast.Call) and getattr(default.func, "id", "") in makers:
                        offenders.append(f"{path.name}: {node.name}")
    assert not offenders, offenders
