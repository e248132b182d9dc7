"""The CUDA timing and capture paths, against a fake torch.cuda that records what ran where.

Checked against torch 2.13 (torch/cuda/streams.py `Event.record(stream=None)` records on the *current device's*
current stream; torch/cuda/graphs.py `graph(cuda_graph, pool=None, stream=None)` captures on a private side stream
of the current device, `CUDAGraph.replay()` returns None and reruns the captured kernels on the memory they were
captured with, `CUDAGraph.pool()` is what `make_graphed_callables` shares between a forward's graph and its
backward's, captured in the order they run; docs/source/notes/cuda.md "Stream semantics of backward passes": backward ops run on their forward's
stream). So timing cuda:1 must make cuda:1 current and record events on its stream, and a backward captured as a
graph needs its forward built on the capture stream."""

import contextlib
from typing import NamedTuple
from unittest import mock

import pytest
import torch

from harness.measure import cuda_graph, timing
from harness.measure.timing import TimingConfig


class FakeStream(NamedTuple):
    kind: str
    index: int

    def wait_stream(self, other):
        pass


class FakeCuda:
    """Enough of torch.cuda to run the harness's timing and capture code on the CPU, logging each step."""

    def __init__(self):
        self.log: list[tuple] = []
        self.current_device = 0
        self.current_stream_obj = None
        self.graphs: list = []
        self.capturing = None

    # devices and streams
    def device(self, device):
        fake = self

        @contextlib.contextmanager
        def scope():
            before, fake.current_device = fake.current_device, torch.device(device).index
            fake.log.append(("device", fake.current_device))
            try:
                yield
            finally:
                fake.current_device = before
        return scope()

    def current_stream(self, device=None):
        index = self.current_device if device is None else torch.device(device).index
        return self.current_stream_obj or FakeStream("default", index)

    def Stream(self, device=None):
        return FakeStream("side", torch.device(device).index)

    def stream(self, stream):
        fake = self

        @contextlib.contextmanager
        def scope():
            before, fake.current_stream_obj = fake.current_stream_obj, stream
            try:
                yield
            finally:
                fake.current_stream_obj = before
        return scope()

    def synchronize(self, device=None):
        self.log.append(("sync", torch.device(device).index if device is not None else self.current_device))

    # events
    def Event(self, enable_timing=False):
        fake = self

        class Event:
            def record(self, stream=None):
                self.stream = stream if stream is not None else fake.current_stream()
                fake.log.append(("record", self.stream))

            def elapsed_time(self, other):
                return 1.0
        return Event()

    # graphs: a kernel launched while a graph captures is recorded in it (launch), and a replay runs the record
    def CUDAGraph(self):
        fake = self

        class Graph:
            def __init__(self):
                self.ops, self.number = [], len(fake.graphs)
                fake.graphs.append(self)

            def replay(self):
                fake.log.append(("replay",) if self.number == len(fake.graphs) - 1 else ("replay", self.number))
                for op in self.ops:
                    op()

            def pool(self):
                return ("pool", self.number)
        return Graph()

    def graph(self, g, pool=None, stream=None):
        fake = self

        @contextlib.contextmanager
        def capture():
            fake.log.append(("capture", stream))
            fake.capturing = g
            with fake.stream(stream):
                yield
            fake.capturing = None
            fake.log.append(("captured", stream))
        return capture()

    def launch(self, op):
        """A kernel launch: recorded by the graph being captured, else run now."""
        if self.capturing is not None:
            self.capturing.ops.append(op)
        else:
            op()


@pytest.fixture
def fake():
    f = FakeCuda()
    names = ["device", "current_stream", "Stream", "stream", "synchronize", "Event", "CUDAGraph", "graph"]
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(mock.patch.object(torch.cuda, name, getattr(f, name)))
        # the clocks timing binds at import, bound again to the fake's event API
        stack.enter_context(mock.patch.object(timing, "CLOCKS", timing.Clocks(
            timing.CLOCKS.now_ns, f.Event, lambda event, stream: event.record(stream),
            lambda start, end: start.elapsed_time(end), f.synchronize)))
        real_empty = torch.empty
        stack.enter_context(mock.patch.object(torch, "empty", lambda *a, device=None, **k: real_empty(
            1, dtype=k.get("dtype", torch.float32))))  # the L2 flush buffer, without a GPU
        yield f


def test_events_of_cuda1_record_on_cuda1s_stream_with_cuda1_current(fake):
    ran_on = []
    config = TimingConfig(warmup_ms=0, budget_ms=3, min_reps=3, max_reps=3)
    m = timing.measure(lambda: ran_on.append((fake.current_device, fake.current_stream())),
                       device=torch.device("cuda", 1), config=config)
    records = [entry[1] for entry in fake.log if entry[0] == "record"]
    assert records and set(records) == {("default", 1)}  # never device 0's stream
    assert set(ran_on) == {(1, ("default", 1))} and m.n == 3 and m.mode == "cuda-events"


def test_a_graphed_backward_builds_its_forward_on_the_capture_stream(fake):
    stream_of = {}

    def build():
        stream_of["build"] = fake.current_stream()

    def fn():
        stream_of.setdefault("fn", set()).add(fake.current_stream())

    replay = cuda_graph.Captured(fn, lambda: None, torch.device("cuda", 1), build).replay
    capture = next(entry for entry in fake.log if entry[0] == "capture")
    assert stream_of["build"] == ("side", 1) == capture[1]  # forward and capture on one side stream of cuda:1
    assert stream_of["fn"] == {("side", 1)}
    assert fake.log.index(capture) > 0 and ("device", 1) in fake.log
    replay()
    assert fake.log[-1] == ("replay",)


def test_a_graphed_backward_reads_what_its_forward_s_graph_computed(fake):
    """A capture records kernels without running them: the backward's replays must read the tensors the captured
    forward computes, so that graph runs once before them (seen on an H200, 2026-12-04: without it every sdpa
    backward replayed on --cuda-graph was judged wrong - it read the pool's leftovers)."""
    memory, read, tokens = {}, [], iter(range(10))

    def build():  # the host part runs at every call, capture included; the kernel only when launched or replayed
        token = next(tokens)
        fake.launch(lambda: memory.__setitem__("saved", token))

    captured = cuda_graph.Captured(lambda: fake.launch(lambda: read.append(memory.get("saved"))), lambda: None,
                                   torch.device("cuda", 0), build)
    assert read == [0, 0, 0]  # the warm-up calls, on the eager forward's (token 0)
    captured.replay()
    captured.replay()
    assert read[3:] == [1, 1]  # the captured forward's (token 1), not the eager one's left in memory


def test_timing_with_a_graph_replays_and_never_times_the_build(fake):
    order = []
    config = TimingConfig(warmup_ms=0, budget_ms=2, min_reps=2, max_reps=2, cuda_graph=True)
    fn, build = lambda: order.append("fn"), lambda: order.append("build")
    timed = timing.Timed(fn, build=build).capture(torch.device("cuda", 0))
    m = timing.measure(timed, device=torch.device("cuda", 0), config=config)
    # built once for the warm-up and once captured (its own graph), both before any event
    assert order[0] == "build" and order.count("build") == 2 and m.mode == "cuda-graph"
    replays = [i for i, entry in enumerate(fake.log) if entry == ("replay",)]
    records = [i for i, entry in enumerate(fake.log) if entry[0] == "record"]
    assert replays and records and min(records) < max(replays) < max(records)  # replays inside the events


def test_a_graph_s_every_replay_reads_fresh_content_and_its_static_output_is_judged(fake):
    """The round's guard (round.TimedRound's steps) around a graph's replays: a call's content is written into
    the static inputs before every replay's events, and what each sample's step gets is the graph's static output,
    after its end event, the last one's by after_last_call. (An eager call after the replays would be judged instead
    of a replay, and judge nothing the samples did.)"""
    x = torch.ones(4)
    made, calls, seen = {}, [], []

    def fn():
        calls.append(1)
        out = made.setdefault("out", torch.zeros(4))
        fake.launch(lambda: out.copy_(x + 1))
        return out

    class Round(timing.Timed):
        def before_call(self):
            fake.log.append(("content",))
            x.add_(1.0)

        def in_call(self, value):
            fake.log.append(("read",))

        def after_call(self, value, left):
            fake.log.append(("judged", left == 0))
            seen.append((value, value.clone()))

        def after_last_call(self, value):
            self.after_call(value, 0)

    config = TimingConfig(warmup_ms=0, budget_ms=3, min_reps=3, max_reps=3, cuda_graph=True)
    timed = Round(fn).capture(torch.device("cuda", 0))
    m = timing.measure(timed, device=torch.device("cuda", 0), config=config)
    assert m.mode == "cuda-graph" and m.n == 3 and len(calls) == 4  # 3 warm-up calls, 1 captured: no eager call after
    assert all(v is made["out"] for v, _ in seen) and len(seen) == 3  # the static output, every sample
    last = x[0].item()  # what the last content left: the last replay read it
    assert [c.tolist() for _, c in seen] == [[last - 1.0] * 4, [last] * 4, [last + 1.0] * 4]
    log = [e for e in fake.log if e[0] in ("content", "replay", "record", "read", "judged")]
    # the last sample: content, then its events around the call's replay and the read of its answer (issue 62 item
    # 2: enqueued inside the events), then judged as the last
    assert log[-6:] == [("content",), ("record", ("default", 0)), ("replay",), ("read",), ("record", ("default", 0)),
                        ("judged", True)], log[-6:]
    assert log.count(("judged", False)) == 2


def test_a_captured_backward_keeps_the_gradients_it_writes(fake):
    """setup (a gradient reset) runs before the warm-up calls and the capture, never between replays: the
    gradients a captured backward writes stay the leaves' .grad, where answers reads them."""
    setups = []
    config = TimingConfig(warmup_ms=0, budget_ms=3, min_reps=3, max_reps=3, cuda_graph=True)
    fn, setup = (lambda: fake.launch(lambda: None)), (lambda: setups.append(sum(e[0] in ("capture", "replay")
                                                                                for e in fake.log)))
    timing.measure(timing.Timed(fn, setup).capture(torch.device("cuda", 0)), device=torch.device("cuda", 0),
                   config=config)
    assert setups == [0, 0, 0, 0]  # 3 warm-up calls and the capture, before it; none once the graph exists


def test_a_backward_timed_as_a_graph_is_a_phase_of_replays_on_fresh_d_out(fake):
    """round.TimedRound.capture on a real (CPU) backward with the fake graph: the forward is made for the warm-up
    and made again inside a graph of its own; the gradients the captured backward wrote are the leaves' .grad
    (setup ran before the capture); the round sets nothing up and builds nothing since, its call is the call's
    replay, and a call's content goes into the static dO alone (the forward's graph keeps its q, k, v) - no eager
    forward."""
    from harness.backends.naive import Naive
    from harness.calls.round import TimedRound
    from harness.cases.case import AttentionCase, make_inputs

    case = AttentionCase(1, 2, 8, 8, "fp32")
    inputs = make_inputs(case, "cpu", 1)
    timed = TimedRound(Naive(), case, "bwd", torch.device("cpu"), inputs)
    builds = []
    build = timed.build
    timed.build = lambda: (builds.append(fake.capturing is not None), build())
    timed.capture(torch.device("cuda", 0))
    assert builds == [False, True] and timed.setup is timing._nothing and timed.build is timing._nothing
    assert timed.buffers["q"].grad is not None  # written by the captured backward, not reset since
    fake.log.clear()
    new = make_inputs(case, "cpu", 2)
    timed.fresh(new)  # a new q too: dO alone is written
    assert set(timed.sources(inputs)) == {"dO"} and torch.equal(timed.buffers["dO"], new.d_out)
    assert torch.equal(timed.buffers["q"], inputs.q) and fake.log == [] and builds == [False, True]
    assert timed.call() is None and fake.log[-1] == ("replay",)
    assert set(timed.answers(None)) == {"dq", "dk", "dv"}  # no output: the gradients alone


def test_an_event_api_rewritten_after_binding_changes_no_sample_and_slowed_events_disagree_with_the_host(fake):
    """timing reads the event API bound at import (Clocks): a plugin's later torch.cuda.Event is never used; events
    that claim 1 ms for calls the host clock saw take 50 ms (a rewritten binding) fail the clock audit, honest ones
    pass it."""
    from dataclasses import replace

    from harness.run.audit import EVENT_SLACK_MS, clock_disagreement

    config = TimingConfig(warmup_ms=0, budget_ms=3, min_reps=3, max_reps=3)
    with mock.patch.object(torch.cuda, "Event", lambda enable_timing=False: pytest.fail("an unbound Event was used")):
        m = timing.measure(lambda: None, device=torch.device("cuda", 0), config=config)
    assert m.samples_ms == (1.0,) * 3 and m.event_vs_host is not None
    now = [0]
    for host_ms, rejected in ((50, True), (1, False)):
        def call(step=host_ms):
            now[0] += step * 1_000_000

        with mock.patch.object(timing, "CLOCKS", replace(timing.CLOCKS, now_ns=lambda: now[0])):
            m = timing.measure(call, device=torch.device("cuda", 0), config=config)
        assert m.event_vs_host == (1.0, 3 * host_ms)
        assert bool(clock_disagreement(sum(m.samples_ms), *m.event_vs_host, "events", EVENT_SLACK_MS)) == rejected
