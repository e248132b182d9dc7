"""MIG: instances are named 'MIG-…' (not 'GPU-…') for NVML and nvidia-smi, and `run --gpus all` spreads over the
instances nvidia-smi lists, since a process under MIG sees a single device (torch's device_count() is 1)."""

import types
from unittest import mock

import torch

from harness.launch.local import gpu_devices
from harness.store.host import gpu_uuid, smi_devices

LISTING = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5b3b9d1e-0000-1111-2222-333344445555)
  MIG 3g.40gb     Device  0: (UUID: MIG-11c2a3b4-aaaa-bbbb-cccc-ddddeeeeffff)
  MIG 3g.40gb     Device  1: (UUID: MIG-99887766-aaaa-bbbb-cccc-000011112222)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-0a0b0c0d-0000-1111-2222-333344445555)
"""


def test_nvidia_smi_listing_is_parsed():
    assert [u for _, u in smi_devices(LISTING)] == ["GPU-5b3b9d1e-0000-1111-2222-333344445555",
                                                    "MIG-11c2a3b4-aaaa-bbbb-cccc-ddddeeeeffff",
                                                    "MIG-99887766-aaaa-bbbb-cccc-000011112222",
                                                    "GPU-0a0b0c0d-0000-1111-2222-333344445555"]


def test_a_mig_instance_keeps_its_mig_prefix():
    props = types.SimpleNamespace(uuid="99887766-aaaa-bbbb-cccc-000011112222")
    with mock.patch.object(torch.cuda, "get_device_properties", lambda d: props):
        assert gpu_uuid(torch.device("cuda", 0), LISTING) == "MIG-99887766-aaaa-bbbb-cccc-000011112222"
    props.uuid = "0a0b0c0d-0000-1111-2222-333344445555"
    with mock.patch.object(torch.cuda, "get_device_properties", lambda d: props):
        assert gpu_uuid(torch.device("cuda", 0), LISTING) == "GPU-0a0b0c0d-0000-1111-2222-333344445555"


def test_gpus_all_under_mig_is_one_shard_per_instance(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    devices, visible = gpu_devices("all", LISTING)
    assert devices == ["cuda:0", "cuda:0"]
    assert visible == ["MIG-11c2a3b4-aaaa-bbbb-cccc-ddddeeeeffff", "MIG-99887766-aaaa-bbbb-cccc-000011112222"]
    assert gpu_devices("1", LISTING)[1] == ["MIG-99887766-aaaa-bbbb-cccc-000011112222"]
