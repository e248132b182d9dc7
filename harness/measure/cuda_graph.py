"""Capturing a timed call in a CUDA graph, so replays time the kernels without launch overhead."""

from __future__ import annotations

from typing import Callable

import torch


def graphed(fn: Callable[[], object], setup: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """Capture fn in a CUDA graph (removes launch overhead, as do_bench_cudagraph does); returns its replay."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):  # warm up on a side stream before capture, as CUDA graphs require
        for _ in range(3):
            setup()
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    setup()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay
