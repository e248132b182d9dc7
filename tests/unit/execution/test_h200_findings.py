"""What the first GPU runs (one H200, torch 2.11.0+cu130, 2026-11-30) found in the execution layer, pinned on CPU.

- torch.cuda.set_device raises on a bare 'cuda' (torch/cuda/_utils.py `_get_device_index(optional=False)`,
  torch 2.11-2.13): every worker of a `--device cuda` run failed to start and every row read 'unavailable'. CUDA
  devices are now always indexed, and a worker that cannot start is the harness's failure (an `error` row).
- AOTAutograd's donated buffers (torch/_functorch/_aot_autograd/runtime_wrappers.py, 2.11-2.13) refuse the
  retain_graph=True backward the bwd phase replays: every flex bwd timing row was an error. Each process that
  runs backends turns them off first.
"""

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
from harness.execution.session import RunSession

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


def test_sessions_and_workers_turn_donated_buffers_off_before_any_backend_runs(tmp_path, monkeypatch):
    import torch._functorch.config as functorch_config

    monkeypatch.setattr(functorch_config, "donated_buffer", True)
    RunSession(CPU, tmp_path)
    assert functorch_config.donated_buffer is False
    monkeypatch.setattr(functorch_config, "donated_buffer", True)
    seen = tmp_path / "seen.txt"
    probe = tmp_path / "donation_probe.py"  # a plugin module the worker loads after its setup: it reports the flag
    probe.write_text("import torch._functorch.config as c\n"
                     f"open({str(seen)!r}, 'w').write(str(c.donated_buffer))\n")
    executor = IsolatedExecutor(CPU, modules=(str(probe),), log_dir=str(tmp_path / "workers"))
    try:
        assert refusal(Naive(), AttentionCase(1, 2, 8, 8, "fp32"), CPU, executor) is None
    finally:
        executor.close()
    assert seen.read_text() == "False"
