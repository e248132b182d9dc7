"""harness.calls.device: a CUDA device is always indexed (torch.cuda.set_device refuses a bare 'cuda':
torch/cuda/_utils.py `_get_device_index(optional=False)`, torch 2.11-2.13), and an index beyond the devices is a
one-line error. Two GPUs are faked on CPU."""

import pytest
import torch

from harness.calls.device import indexed, resolve_device


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
    assert indexed(torch.device("cpu")) == torch.device("cpu")


def test_a_cuda_index_beyond_the_devices_is_refused(two_gpus):
    with pytest.raises(ValueError, match=r"device 'cuda:2': torch sees 2 CUDA device\(s\), cuda:0 to cuda:1"):
        resolve_device("cuda:2")
