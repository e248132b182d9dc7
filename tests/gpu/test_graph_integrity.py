"""--cuda-graph timing on a real device: every sample a replay on content of its own (round.TimedRound), the
last one always judged (outputs and gradients read from the graph's own memory after a synchronisation); and the
clock audit's events against the host clock.

The real-device counterpart of tests/unit/measure/test_cuda_paths.py (capture order, a call's content written
before each replay, the static output observed, events rewritten after binding)."""

from __future__ import annotations

import pytest
import torch

from harness import AttentionCase
from harness.backends.registry import get_backends
from harness.run.benchmark import measure_phase
from harness.isolation.executor import make_executor
from harness.run.runner import execute, prepare_case
from harness.measure.timing import TimingConfig
from harness.cases.masks import Causal
from harness.store.schema import REJECTED, TIMED
from tests.fixtures import gamed_kernels as gamed

pytestmark = pytest.mark.cuda
GRAPH = TimingConfig(warmup_ms=2, budget_ms=10, min_reps=5, max_reps=50, cuda_graph=True)
CASE = AttentionCase(2, 4, 256, 64, "bf16", mask=Causal())


def _timed(backend, phase: str):
    device = torch.device("cuda")
    executor = make_executor(device, isolate=False)
    prepared = prepare_case(CASE, device, 7)
    verdict = execute(backend, prepared, executor=executor)
    assert verdict.status == "pass", verdict.reasons
    return measure_phase(backend, prepared, phase, verdict, config=GRAPH, peaks={}, executor=executor).row


@pytest.mark.parametrize("phase", ["fwd", "bwd", "fwd+bwd"])
def test_an_honest_kernel_is_timed_as_a_graph_on_every_phase(phase):
    """sdpa's replays, each on its own content (for bwd: a new dO on its forward's graph, built on the round's
    content), are the verified answer once undone, within the tolerance: timed, in cuda-graph mode."""
    row = _timed(get_backends(["sdpa"])[0], phase)
    assert row.timing_status == TIMED and row.timing_mode == "cuda-graph" and row.latency_ms > 0, row.timing_reason


def test_a_graph_that_captured_an_answer_instead_of_the_work_is_rejected():
    row = _timed(gamed.CapturesLastAnswer(), "fwd")
    # every replay's static inputs hold new content: the first observed replay is already wrong
    assert row.timing_status == REJECTED and "out err" in row.timing_reason, row.timing_reason
    assert row.latency_ms is None


def test_events_agree_with_the_host_clock_and_slowed_ones_do_not():
    """sdpa's events over its repetitions against the host clock around them (Measurement.event_vs_host): within
    EVENT_SLACK_MS; the same events read through a binding slowed 5x (what a plugin that rewrote it reads) are not,
    on a round of 50 ms."""
    from dataclasses import replace

    from harness.run.audit import EVENT_SLACK_MS, clock_disagreement
    from harness.measure import timing

    device = torch.device("cuda")
    a = torch.randn(2048, 2048, device=device)
    config = TimingConfig(warmup_ms=5, budget_ms=50, min_reps=10, max_reps=500)
    m = timing.measure(lambda: a @ a, device=device, config=config)
    assert clock_disagreement(sum(m.samples_ms), *m.event_vs_host, "events", EVENT_SLACK_MS) == ""
    elapsed = timing.CLOCKS.elapsed_ms
    slowed = replace(timing.CLOCKS, elapsed_ms=lambda start, end: elapsed(start, end) / 5)
    real, timing.CLOCKS = timing.CLOCKS, slowed
    try:
        m = timing.measure(lambda: a @ a, device=device, config=config)
    finally:
        timing.CLOCKS = real
    assert clock_disagreement(sum(m.samples_ms), *m.event_vs_host, "events", EVENT_SLACK_MS)
