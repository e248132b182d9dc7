"""Capturing a timed call in a CUDA graph, so replays time the kernels without launch overhead."""

from __future__ import annotations

from typing import Callable

import torch


class Captured:
    """fn captured in a CUDA graph on `device` (removes launch overhead, as do_bench_cudagraph does).

    replay() runs the graph and returns what fn returned when captured: its static output, which every replay
    writes again (read it after a synchronisation). `build` - what fn reads that is made once, a backward's
    forward - is captured too, in a graph of its own that shares the call's memory pool, as
    torch.cuda.make_graphed_callables captures a forward and then its backward: rebuild() replays it, so the
    forward's saved tensors are recomputed from whatever the static inputs hold now (new inputs copied in), and
    the next replay of the call differentiates that forward.

    Both are built on one side stream of `device`: a backward timed alone replays ops autograd issues on the
    stream of their forward, so that forward must be built on the stream the capture uses (torch docs, "Stream
    semantics of backward passes"); never the current device's default stream (the capture would fail) nor
    another device's (cuda:N). `setup` runs before the warm-up calls and before the capture (gradients reset:
    the captured backward then writes gradients of its own, which stay the leaves' .grad through every replay),
    and never between replays (a graph replays what it captured; host work would change nothing in it)."""

    def __init__(self, fn: Callable[[], object], setup: Callable[[], None] | None, device: torch.device,
                 build: Callable[[], None] | None = None):
        setup = setup or (lambda: None)
        self._build_graph = None
        with torch.cuda.device(device):
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                if build is not None:
                    build()
                for _ in range(3):  # warm up on the side stream before capture, as CUDA graphs require
                    setup()
                    fn()
            torch.cuda.current_stream(device).wait_stream(stream)
            pool = None
            if build is not None:  # the forward first, then its backward, on one pool (make_graphed_callables' order)
                self._build_graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self._build_graph, stream=stream):
                    build()
                pool = self._build_graph.pool()
            self._graph = torch.cuda.CUDAGraph()
            setup()
            with torch.cuda.graph(self._graph, pool=pool, stream=stream):
                self.value = fn()

    def replay(self) -> object:
        """One replay of the call; its static output (None when the call returns nothing, e.g. a backward)."""
        self._graph.replay()
        return self.value

    def rebuild(self) -> None:
        """Replay the build's graph (nothing without a build): its outputs recomputed from the static inputs."""
        if self._build_graph is not None:
            self._build_graph.replay()


def graphed(fn: Callable[[], object], setup: Callable[[], None] | None, device: torch.device,
            build: Callable[[], None] | None = None) -> Callable[[], object]:
    """The replay of fn captured in a CUDA graph (Captured); build, a backward's forward, is captured first."""
    return Captured(fn, setup, device, build).replay
