"""Judged where the answer lives, on a real device (issue 63): a worker's answers cross by CUDA IPC and are judged on
the GPU against a reference kept there; a forged handle is refused in one line; one gpu-smoke key's round timed
against its budget (the figure printed: `pytest tests/gpu -s`).

The real-device counterparts of tests/unit/execution/test_cuda_transport.py and tests/unit/oracle/
test_device_judging.py (the same logic with fakes, on the CPU)."""

from __future__ import annotations

import io
import multiprocessing
import pickle
import time
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from harness.backends.registry import get_backends
from harness.cases.matrices import build_matrix
from harness.isolation.executor import make_executor
from harness.isolation.wire import HANDLE_FIELDS, Channel, _Pickler
from harness.run.runner import correctness_call, execute, prepare_case
from harness.run.session import RunSession
from harness.store.schema import FWD, PASS

pytestmark = pytest.mark.cuda
DEVICE = torch.device("cuda", 0)


def _smallest_gpu_smoke_case():
    return min(build_matrix("gpu-smoke"), key=lambda c: c.batch * c.heads * c.seq_q * c.seq_k * c.head_dim)


def test_a_worker_s_answers_cross_by_handle_and_are_judged_on_the_device():
    case = _smallest_gpu_smoke_case()
    sdpa = get_backends("sdpa")[0]
    executor = make_executor(DEVICE, isolate=True)
    try:
        prepared = prepare_case(case, DEVICE)
        assert prepared.reference.out.is_cuda  # a gpu-smoke reference fits a quarter of any GPU's free memory
        answer = executor.call(sdpa, correctness_call(sdpa, case, DEVICE, prepared.seed), DEVICE)
        assert answer.failure is None and answer.out.is_cuda
        result = execute(sdpa, prepared, executor=executor)
        assert {r.phase: r.status for r in result.rows}[FWD] == PASS
    finally:
        executor.close()


def test_a_forged_handle_is_refused_in_one_line():
    class Forged(_Pickler):
        def persistent_id(self, obj):
            return ("cuda", 0) if isinstance(obj, torch.Tensor) else None

    buffer = io.BytesIO()
    Forged(buffer, pickle.HIGHEST_PROTOCOL).dump({"out": torch.zeros(4, 8)})
    fields = dict(size=(4, 8), stride=(8, 1), offset=0, dtype=torch.float32, device=0, handle=bytes(range(64)),
                  storage_bytes=128, storage_offset_bytes=0, ref_counter_handle=b"/no-such-counter",
                  ref_counter_offset=0, event_handle=None, event_sync_required=False)
    sender, receiver = multiprocessing.Pipe()
    sender.send_bytes(bytes(ForkingPickler.dumps((buffer.getvalue(), None, (),
                                                   (tuple(fields[n] for n in HANDLE_FIELDS),)))))
    with pytest.raises(pickle.UnpicklingError, match="names no CUDA allocation") as caught:
        Channel(receiver, from_backend=True).recv()
    assert "\n" not in str(caught.value)


def test_one_gpu_smoke_key_s_round_against_its_budget(tmp_path, capsys):
    """Issue 63's target: a timed key within 1.5x its budget at the median over gpu-smoke's keys (the selftest's
    benchmark step prints that median); here one key, a warm round, held to a looser 3x so a busy node passes."""
    case = _smallest_gpu_smoke_case()
    sdpa = get_backends("sdpa")[0]
    session = RunSession(DEVICE, tmp_path, rounds=2, executor=make_executor(DEVICE, isolate=True))
    try:
        verdict = session.check(case, sdpa)
        session.benchmark_round(case, sdpa, FWD, 0, verdict)  # the first: compiles, the memory probe
        budget = session.schedule.timing_of(1)
        start = time.perf_counter()
        result = session.benchmark_round(case, sdpa, FWD, 1, verdict)
        wall = time.perf_counter() - start
    finally:
        session.finish()
    if result is None:
        pytest.skip("the schedule ended this key after its first round")
    ratio = wall * 1e3 / (budget.warmup_ms + budget.budget_ms)
    with capsys.disabled():
        print(f"\n[issue 63] gpu-smoke {case.id} sdpa fwd: round {wall * 1e3:.0f} ms = {ratio:.2f}x its budget of "
              f"{budget.warmup_ms + budget.budget_ms:g} ms")
    assert ratio < 3.0, f"a warm round took {ratio:.2f}x its budget"
