"""harness.isolation.supervisor: a worker that cannot start is the harness's failure, not the backend's absence.

Seen on the first GPU runs (one H200, torch 2.11.0+cu130, 2026-11-30): torch.cuda.set_device raised on a bare
'cuda' (torch/cuda/_utils.py `_get_device_index(optional=False)`, torch 2.11-2.13), every worker of a
`--device cuda` run failed to start, and every row read 'unavailable'."""

import torch

from harness.backends.base import Backend
from harness.backends.naive import Naive
from harness.isolation.supervisor import IsolatedExecutor
from harness.run.runner import refusal
from harness.cases.case import AttentionCase
from harness.store.schema import ERROR

CPU = torch.device("cpu")


def test_a_worker_that_cannot_start_gives_an_error_row_not_unavailable(tmp_path):
    ghost = type("Ghost", (Backend,), {"name": "not-in-the-worker"})()  # registered here only: the worker refuses
    executor = IsolatedExecutor(CPU, modules=(), log_dir=str(tmp_path / "workers"))
    case = AttentionCase(1, 2, 8, 8, "fp32")
    try:
        status, reason = refusal(ghost, case, CPU, executor)
        assert status == ERROR
        assert "the worker of not-in-the-worker could not start" in reason and "not registered" in reason
        assert refusal(Naive(), case, CPU, executor) is None  # the other workers are unaffected
    finally:
        executor.close()
