"""The trust boundary (issue 47, items 1 and 6a): a plugin module is imported only in its own processes (the process
that declares it and its backend's workers), never in the run's process nor in another backend's worker; a plugin
that disarms torch's comparisons at import and answers empty tensors once judged gets no timed figure, while naive
and sdpa in the same run keep theirs (harness.isolation.plugin_host, supervisor, wire.Channel)."""

import os
import pickle
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.backends import registry
from harness.backends.registry import get_backends
from harness.isolation.plugin_host import load_backend_module
from harness.isolation import plugin_host
from harness.isolation.executor import make_executor
from harness.run.session import RunSession
from harness.isolation.wire import _Answers
from harness.measure.timing import TimingConfig
from harness.cases.case import AttentionCase
from harness.store.schema import REJECTED, TIMED

CPU = torch.device("cpu")
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "disarming_plugin.py"
NAME = "gamed-disarming"
FAST = TimingConfig(warmup_ms=2, budget_ms=10, min_reps=5, max_reps=20)
CASE = AttentionCase(1, 2, 16, 32, "fp32")


@pytest.fixture
def plugin(tmp_path):
    """The disarming plugin copied beside an empty pid file (it appends the pid of each process importing it),
    declared from its own process; afterwards its process is stopped and its stand-in unregistered."""
    path = tmp_path / FIXTURE.name
    shutil.copy(FIXTURE, path)
    pids = path.with_suffix(".pids")
    pids.write_text("")
    real_equal = torch.equal
    host = load_backend_module(str(path))
    try:
        yield host, pids
    finally:
        host.close()
        plugin_host._HOSTS.pop(host.spec, None)
        registry._REGISTRY.pop(NAME, None)
        registry._ORIGIN.pop(NAME, None)
        registry._LOADED.remove(host.spec)
        assert torch.equal is real_equal


def test_a_disarming_plugin_runs_only_in_its_own_processes_and_gets_no_timed_figure(plugin, tmp_path):
    host, pids = plugin
    naive, sdpa, disarming = get_backends(["naive", "sdpa", NAME])
    assert isinstance(disarming, plugin_host.Declared) and disarming.modifiers == sdpa.modifiers  # data, as declared
    session = RunSession(CPU, tmp_path / "run", timing=FAST, executor=make_executor(CPU, isolate=True))
    try:
        for backend in (naive, sdpa, disarming):
            assert session.check(CASE, backend).status == "pass"  # its first no-grad call is sdpa's answer
        rows = {(b.name, phase): session.benchmark_round(CASE, b, phase, 0, session.verdict(CASE, b)).row
                for b in (naive, sdpa, disarming) for phase in ("fwd", "bwd")}
        workers = {name: worker.process.pid for name, worker in session.executor.workers.items()}
    finally:
        session.finish()
    row = rows[(NAME, "fwd")]
    # empty_like's memory: wrong, or NaN where an earlier answer was poisoned
    assert row.timing_status == REJECTED and row.latency_ms is None, row
    assert "out err" in row.timing_reason or "out has NaN" in row.timing_reason, row.timing_reason
    # its backward is sdpa's, honest: every timed call's answer judged in the run's process against fresh content
    # (the refill no longer compares buffers in its worker, where torch.equal is the plugin's), so it is timed
    assert rows[(NAME, "bwd")].timing_status == TIMED and rows[(NAME, "bwd")].latency_ms > 0
    for name in ("naive", "sdpa"):
        assert all(rows[(name, p)].timing_status == TIMED and rows[(name, p)].latency_ms > 0 for p in ("fwd", "bwd"))
    imported = {int(line) for line in pids.read_text().split()}
    assert imported == {host.pid, workers[NAME]}  # its declaring process and its own worker, nothing else
    assert os.getpid() not in imported and workers["naive"] not in imported and workers["sdpa"] not in imported
    assert not [m for m in sys.modules if "disarming" in m]  # never imported in the run's process


def test_an_isolated_run_believes_no_worker_claim_of_an_answer_elided(plugin, tmp_path):
    """A worker's reply missing its answers (as though told equal where it ran) is not believed: they must come back,
    and the run's judge calls a missing one a missing answer."""
    from harness.run.judge import judge_timed
    from harness.run.runner import prepare_case
    from harness.calls.timed import TimingResult

    session = RunSession(CPU, tmp_path / "run", timing=FAST, executor=make_executor(CPU, isolate=True))
    executor = session.executor
    from harness.calls.round import Observed
    forged = TimingResult(observed=[Observed({}, {}, 1)])  # no answer: "elided"
    try:
        naive = get_backends(["naive"])[0]
        executor._ask = lambda *args, **kwargs: ("ok", forged)  # what a rewritten worker could send
        executor.workers["naive"] = SimpleNamespace(asked_ns=0, asked_ms=1.0,  # the run's clock around that ask
                                                    child=SimpleNamespace(brackets=SimpleNamespace(
                                                        witnessed=lambda threads: None)))
        from harness.calls.timed import TimingCall
        from harness.calls.call import Call
        timing = TimingCall(Call(CASE, 0), "fwd", FAST)
        answer = executor.time(naive, timing, CPU)
    finally:
        executor.workers.pop("naive", None)  # the stand-in above is no process to stop
        session.finish()
    assert judge_timed(naive.name, prepare_case(CASE, CPU, 0), "fwd", answer.observed, timing.seed,
                       answer.witness).endswith("returned no out")


@pytest.mark.parametrize("payload, words", [
    (pickle.dumps(eval), "builtins.eval"),
    (pickle.dumps(os.system), "posix.system"),
    (pickle.dumps(load_backend_module), "harness.isolation.plugin_host.load_backend_module"),
])
def test_the_run_unpickles_only_data_from_a_backend_process(payload, words):
    import io

    with pytest.raises(pickle.UnpicklingError, match=words.replace(".", r"\.")):
        _Answers(io.BytesIO(payload)).load()


def test_a_bad_declaration_is_refused_from_the_plugins_process_in_one_line(tmp_path):
    path = tmp_path / "bad_plugin.py"
    path.write_text("import torch\nfrom harness import Backend, register\n\n@register\nclass Bad(Backend):\n"
                    "    name = 'bad-declared'\n    dtypes = 'fp16'\n"
                    "    def forward(self, q, k, v, *, mask, scale):\n        return q\n")
    with pytest.raises(ValueError, match=r"^backend 'bad-declared' \(Bad in .*bad_plugin.py:\d+\): dtypes='fp16'"):
        load_backend_module(str(path))
    assert "bad-declared" not in registry.all_backends()


@pytest.mark.parametrize("layout", [((torch.float32, (1000,), 0),), ((torch.float32, (4,), -8),), (("x", (4,), 0),),
                                    ((torch.float32, (4,), 0),) * 0])
def test_a_message_s_tensor_outside_its_arena_is_refused(layout):
    """wire.Channel.recv: a backend's process names each large tensor by (dtype, shape, offset) in its arena; one that
    does not lie within it - too long, before it, no dtype, not listed - is refused."""
    import io
    import multiprocessing
    from multiprocessing.reduction import ForkingPickler

    from harness.isolation.wire import Channel, _Pickler

    buffer = io.BytesIO()
    pickler = _Pickler(buffer, pickle.HIGHEST_PROTOCOL)
    pickler.dump({"out": torch.zeros(64 * 1024)})  # large: named by its index in the arena
    sender, receiver = multiprocessing.Pipe()
    sender.send_bytes(bytes(ForkingPickler.dumps((buffer.getvalue(), torch.zeros(64, dtype=torch.uint8), layout,
                                                             ()))))
    with pytest.raises(pickle.UnpicklingError, match="does not lie within its arena"):
        Channel(receiver, from_backend=True).recv()
