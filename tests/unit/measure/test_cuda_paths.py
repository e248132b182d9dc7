"""The CUDA timing and capture paths, against a fake torch.cuda that records what ran where.

Checked against torch 2.13 (torch/cuda/streams.py `Event.record(stream=None)` records on the *current device's*
current stream; torch/cuda/graphs.py `graph(..., stream=None)` captures on a private side stream of the current
device; docs/source/notes/cuda.md "Stream semantics of backward passes": backward ops run on their forward's
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

    # graphs
    def CUDAGraph(self):
        fake = self

        class Graph:
            def replay(self):
                fake.log.append(("replay",))
        return Graph()

    def graph(self, g, stream=None):
        fake = self

        @contextlib.contextmanager
        def capture():
            fake.log.append(("capture", stream))
            with fake.stream(stream):
                yield
            fake.log.append(("captured", stream))
        return capture()


@pytest.fixture
def fake():
    f = FakeCuda()
    names = ["device", "current_stream", "Stream", "stream", "synchronize", "Event", "CUDAGraph", "graph"]
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(mock.patch.object(torch.cuda, name, getattr(f, name)))
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

    replay = cuda_graph.graphed(fn, lambda: None, torch.device("cuda", 1), build)
    capture = next(entry for entry in fake.log if entry[0] == "capture")
    assert stream_of["build"] == ("side", 1) == capture[1]  # forward and capture on one side stream of cuda:1
    assert stream_of["fn"] == {("side", 1)}
    assert fake.log.index(capture) > 0 and ("device", 1) in fake.log
    replay()
    assert fake.log[-1] == ("replay",)


def test_timing_with_a_graph_replays_and_never_times_the_build(fake):
    order = []
    config = TimingConfig(warmup_ms=0, budget_ms=2, min_reps=2, max_reps=2, cuda_graph=True)
    m = timing.measure(lambda: order.append("fn"), device=torch.device("cuda", 0), config=config,
                       build=lambda: order.append("build"))
    assert order[0] == "build" and order.count("build") == 1 and m.mode == "cuda-graph"
    replays = [i for i, entry in enumerate(fake.log) if entry == ("replay",)]
    records = [i for i, entry in enumerate(fake.log) if entry[0] == "record"]
    assert replays and records and min(records) < max(replays) < max(records)  # replays inside the events
