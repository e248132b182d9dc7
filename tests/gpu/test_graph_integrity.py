"""--cuda-graph timing on a real device: every sample a replay, the last one on new inputs, judged (outputs and
gradients read from the graph's own memory after a synchronisation), and the speed rule applied to it.

The real-device counterpart of tests/unit/measure/test_cuda_paths.py (capture order, renew before the last
replay, the static output observed) and tests/unit/execution/test_integrity_timing.py (the speed rule on a
graph's samples)."""

from __future__ import annotations

import pytest
import torch

from harness import AttentionCase
from harness.backends.registry import get_backends
from harness.execution.benchmark import measure_phase
from harness.execution.executor import make_executor
from harness.execution.runner import execute, prepare_case
from harness.measure.timing import TimingConfig
from harness.spec.masks import Causal
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
    """sdpa's replays, the last on new inputs (for bwd: its forward's graph replayed from them first), are the
    transformed answer within the tolerance: timed, in cuda-graph mode."""
    row = _timed(get_backends(["sdpa"])[0], phase)
    assert row.timing_status == TIMED and row.timing_mode == "cuda-graph" and row.latency_ms > 0, row.timing_reason


def test_a_graph_that_captured_an_answer_instead_of_the_work_is_rejected():
    row = _timed(gamed.CapturesLastAnswer(), "fwd")
    # every replay's static inputs hold new content: the first observed replay is already wrong
    assert row.timing_status == REJECTED and "out err" in row.timing_reason, row.timing_reason
    assert row.latency_ms is None
