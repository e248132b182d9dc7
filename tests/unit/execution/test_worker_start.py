"""A worker that cannot start is the harness's failure (an `error` row), and CUDA devices are always indexed:
torch.cuda.set_device raises on a bare 'cuda' (torch/cuda/_utils.py `_get_device_index(optional=False)`, torch
2.11-2.13), which on an H200 turned every row of a `--device cuda` run into 'unavailable' (seen 2026-11-30)."""

from __future__ import annotations

import pytest
import torch

from harness import AttentionCase
from harness.backends.base import Backend
from harness.backends.naive import Naive
from harness.execution.device import indexed, resolve_device
from harness.execution.executor import IN_PROCESS
from harness.execution.isolation import IsolatedExecutor
from harness.execution.runner import refusal

CPU = torch.device("cpu")


def test_a_worker_that_cannot_start_gives_error_not_unavailable(tmp_path):
    ghost = type("Ghost", (Backend,), {"name": "not-in-the-worker"})()  # registered here only: the worker refuses
    executor = IsolatedExecutor(CPU, modules=(), log_dir=str(tmp_path / "workers"))
    case = AttentionCase(1, 2, 8, 8, "fp32")
    try:
        status, reason = refusal(ghost, case, CPU, executor)
        assert status == "error"
        assert "the worker of not-in-the-worker could not start" in reason and "not registered" in reason
        assert refusal(Naive(), case, CPU, executor) is None  # the other workers are unaffected
    finally:
        executor.close()


def test_an_unavailable_backend_stays_unavailable(tmp_path):
    class Absent(Naive):
        name = "absent"

        def unavailable_reason(self, device):
            return "absent: not installed"

    assert refusal(Absent(), AttentionCase(1, 2, 8, 8, "fp32"), CPU, IN_PROCESS) == ("unavailable",
                                                                                    "absent: not installed")


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)


def test_cuda_is_resolved_to_the_current_device_index(two_gpus):
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert indexed(torch.device("cuda")) == torch.device("cuda", 1)
    assert indexed(CPU) == CPU


def test_a_cuda_index_beyond_the_devices_is_refused(two_gpus):
    with pytest.raises(ValueError, match=r"device 'cuda:2': torch sees 2 CUDA device\(s\), cuda:0 to cuda:1"):
        resolve_device("cuda:2")
