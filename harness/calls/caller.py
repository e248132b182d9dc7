"""torch's process-wide settings: the one every process that runs backends needs (allow_backward_replay), and the
caller's as it was - a check or a recommendation from Python leaves them (functorch, dynamo, thread counts) and this
process's stage clock as it found them."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from harness.measure.stages import STAGE_CLOCK


def allow_backward_replay() -> None:
    """Let a compiled backward run again on one graph (retain_graph), before any backend runs: AOTAutograd's donated
    buffers refuse it (flex's every bwd row on an H200, torch 2.11)."""
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, "donated_buffer"):  # torch >= 2.5
        functorch_config.donated_buffer = False


def _configs() -> list[tuple[object, str]]:
    """(config module, attribute) of every process-wide setting a run may change where its backends run."""
    import torch._functorch.config as functorch_config  # noqa: F401 - imported here: read before anything runs
    from torch._dynamo import config as dynamo_config

    from harness.backends.flex import DYNAMO_SETTINGS  # not at import: a worker imports this module before any backend

    wanted = [(functorch_config, "donated_buffer")] + [(dynamo_config, name) for name in DYNAMO_SETTINGS]
    return [(module, name) for module, name in wanted if hasattr(module, name)]


@contextmanager
def left_as_found() -> Iterator[None]:
    """Run the block, then put back what it changed of torch's process-wide settings and the stage clock."""
    settings = [(module, name, getattr(module, name)) for module, name in _configs()]
    threads = torch.get_num_threads()
    clock = STAGE_CLOCK.snapshot()
    try:
        yield
    finally:
        for module, name, value in settings:
            if getattr(module, name) != value:
                setattr(module, name, value)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        # a folder-less run's stages are not the caller's (a run with a folder resets it anyway)
        STAGE_CLOCK.spent.clear()
        STAGE_CLOCK.spent.update(clock)
