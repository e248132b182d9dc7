"""Capturing a timed call in a CUDA graph, so replays time the kernels without launch overhead."""

from __future__ import annotations

from typing import Callable

import torch


def graphed(fn: Callable[[], object], setup: Callable[[], None] | None, device: torch.device,
            build: Callable[[], None] | None = None) -> Callable[[], None]:
    """Capture fn in a CUDA graph on `device` (removes launch overhead, as do_bench_cudagraph does); its replay.

    `build` runs first, on the capture stream: a backward timed alone replays ops autograd issues on the stream
    of their forward, so that forward must be built on the stream the capture uses (torch docs, "Stream semantics
    of backward passes"). Warm-up and capture both run on one side stream of `device`, never on the current
    device's default stream (the capture would fail) nor on another device's (cuda:N)."""
    setup = setup or (lambda: None)
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
        graph = torch.cuda.CUDAGraph()
        setup()
        with torch.cuda.graph(graph, stream=stream):
            fn()
    return graph.replay
