"""Capturing a timed call in a CUDA graph, so replays time the kernels without launch overhead."""

from __future__ import annotations

from typing import Callable

import torch


class Captured:
    """fn captured in a CUDA graph on `device`, as do_bench_cudagraph does; replay() returns its static output.
    `build` (a backward's forward) is captured first on the same pool, and replayed once before any replay of fn."""

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
            if self._build_graph is not None:
                # a capture records kernels without running them: until the forward's graph runs once, the tensors
                # its backward reads (the output, the log-sum-exp) hold whatever the pool held (seen on an H200:
                # every replayed sdpa backward wrong)
                self._build_graph.replay()

    def replay(self) -> object:
        """One replay of the call; its static output (None when the call returns nothing, e.g. a backward)."""
        self._graph.replay()
        return self.value
