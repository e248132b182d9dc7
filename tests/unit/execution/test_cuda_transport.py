"""A GPU answer crosses to the run's process by CUDA IPC (isolation/wire.py): its handle checked as plain data, opened
by torch's own rebuild (torch 2.13, torch/multiprocessing/reductions.py rebuild_cuda_tensor), copied on the device,
released once the copies are done; a handle that names no allocation of its stated size is refused in one line.
The logic is plain Python and runs here with fakes; tests/gpu/test_device_judging.py opens real handles."""

from __future__ import annotations

import io
import multiprocessing
import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from harness.isolation.wire import HANDLE_FIELDS, Channel, _Answers, _Handles, _Pickler, handle_problem


def good(**changed) -> tuple:
    """Well-formed fields of a (4, 8) float32 view at offset 2 of a 48-element allocation on device 0."""
    fields = dict(size=(4, 8), stride=(8, 1), offset=2, dtype=torch.float32, device=0, handle=b"\x01" * 64,
                  storage_bytes=48 * 4, storage_offset_bytes=0, ref_counter_handle=b"/torch_1_counter",
                  ref_counter_offset=0, event_handle=b"\x02" * 64, event_sync_required=True)
    fields.update(changed)
    return tuple(fields[name] for name in HANDLE_FIELDS)


def test_a_well_formed_handle_has_no_problem():
    assert handle_problem(good(), device_count=1) == ""
    assert handle_problem(good(event_handle=None, event_sync_required=False), device_count=1) == ""
    assert handle_problem(good(size=(0, 8)), device_count=1) == ""  # an empty view reaches nothing


@pytest.mark.parametrize("changed, why", [
    ({"size": (4, 8, 1)}, "no tensor view"), ({"stride": (8, -1)}, "no tensor view"), ({"offset": -1}, "no tensor view"),
    ({"size": [4, 8]}, "no tensor view"), ({"offset": 2.0}, "no tensor view"), ({"size": (True, 8)}, "no tensor view"),
    ({"dtype": "float32"}, "no torch dtype"), ({"device": 1}, "no CUDA device"), ({"device": -1}, "no CUDA device"),
    ({"handle": b""}, "not bytes"), ({"handle": "abc"}, "not bytes"), ({"event_sync_required": 1}, "not bytes"),
    ({"storage_bytes": 0}, "no allocation"), ({"storage_offset_bytes": -64}, "no allocation"),
    ({"offset": 17}, "reaches element 49 of a storage of 48"), ({"storage_bytes": 33 * 4}, "reaches element 34 of a storage of 33"),
    ({"dtype": torch.float64}, "of a storage of 24"), ({"stride": (14, 1)}, "reaches element 52")])
def test_a_malformed_handle_says_what_is_wrong(changed, why):
    assert why in handle_problem(good(**changed), device_count=1)


def test_a_handle_of_the_wrong_length_is_no_handle():
    assert "not the 12 fields" in handle_problem(good()[:-1], device_count=1)
    assert "not the 12 fields" in handle_problem(list(good()), device_count=1)


class FakeOpener:
    """Opens a handle as torch would, on the CPU: a tensor over a storage of the stated size."""

    def __init__(self, fail: Exception | None = None):
        self.fail, self.storages = fail, []

    def __call__(self, fields):
        if self.fail is not None:
            raise self.fail
        f = dict(zip(HANDLE_FIELDS, fields))
        storage = torch.arange(f["storage_bytes"] // f["dtype"].itemsize, dtype=f["dtype"])
        self.storages.append(storage)
        return storage.as_strided(f["size"], f["stride"], f["offset"])


def test_an_opened_handle_is_copied_at_once_and_released_after():
    opener = FakeOpener()
    handles = _Handles((good(),), opener, device_count=lambda: 1)
    copy = handles.load(0)
    assert torch.equal(copy, torch.arange(48.0)[2:34].view(4, 8))
    assert copy.untyped_storage().data_ptr() != opener.storages[0].untyped_storage().data_ptr()
    opener.storages[0].fill_(-1)  # the sender writes its allocation again: the run's copy keeps what came
    assert torch.equal(copy, torch.arange(48.0)[2:34].view(4, 8))
    assert len(handles.opened) == 1
    handles.release()
    assert handles.opened == []


@pytest.mark.parametrize("handles, index", [((good(device=3),), 0), ((good(),), 1), ((good(),), "0"), ((), 0)])
def test_a_bad_handle_is_refused_in_one_line_before_it_is_opened(handles, index):
    opener = FakeOpener()
    with pytest.raises(pickle.UnpicklingError, match="names no CUDA allocation of the size it states") as caught:
        _Handles(handles, opener, device_count=lambda: 1).load(index)
    assert "\n" not in str(caught.value) and str(caught.value).endswith(": refused") and opener.storages == []


def test_a_handle_torch_cannot_open_is_refused_in_one_line():
    """What torch raises for a handle of no allocation (cudaIpcOpenMemHandle: invalid argument) becomes one line."""
    opener = FakeOpener(RuntimeError("CUDA error: invalid argument\nCUDA kernel errors might be reported later"))
    with pytest.raises(pickle.UnpicklingError, match=r"\(RuntimeError: CUDA error: invalid argument\): refused$"):
        _Handles((good(),), opener, device_count=lambda: 1).load(0)


def _message(obj, handles) -> bytes:
    buffer = io.BytesIO()
    pickler = _Pickler(buffer, pickle.HIGHEST_PROTOCOL)
    pickler.dump(obj)
    return bytes(ForkingPickler.dumps((buffer.getvalue(), None, (), handles)))


class AsCuda(_Pickler):
    """The worker's pickler with a CPU tensor standing for a CUDA one: named by handle, not carried."""

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor) and obj.numel() == 32:
            return ("cuda", 0)
        return super().persistent_id(obj)


def test_a_backend_s_handle_is_refused_through_the_channel_in_one_line():
    """The run's end of a real pipe: a message naming a CUDA tensor whose handle this process cannot open (this
    machine has no CUDA device) is refused as the arena's bad tensors are, in one line (Child kills the sender)."""
    buffer = io.BytesIO()
    AsCuda(buffer, pickle.HIGHEST_PROTOCOL).dump({"out": torch.zeros(4, 8)})
    sender, receiver = multiprocessing.Pipe()
    sender.send_bytes(bytes(ForkingPickler.dumps((buffer.getvalue(), None, (), (good(),)))))
    expected = "no CUDA device of this process" if not torch.cuda.is_available() else "names no CUDA allocation"
    with pytest.raises(pickle.UnpicklingError, match=expected) as caught:
        Channel(receiver, from_backend=True).recv()
    assert "\n" not in str(caught.value)


def test_a_message_without_its_handles_is_refused():
    sender, receiver = multiprocessing.Pipe()
    sender.send_bytes(bytes(ForkingPickler.dumps((b"", None, ()))))
    with pytest.raises(pickle.UnpicklingError, match=r"not \(data, arena, layout, handles\)"):
        Channel(receiver, from_backend=True).recv()


@pytest.mark.parametrize("name", ["rebuild_cuda_tensor", "rebuild_event"])
def test_torch_s_own_cuda_rebuilders_are_refused_from_a_backend(name):
    """A backend's message cannot name torch's CUDA rebuilders itself: they would open any handle it names."""
    payload = b"\x80\x04ctorch.multiprocessing.reductions\n" + name.encode() + b"\n."
    with pytest.raises(pickle.UnpicklingError, match="no data type the run accepts"):
        _Answers(io.BytesIO(payload)).load()


def test_a_cpu_tensor_in_shared_memory_still_crosses():
    """The arena itself is a shared-memory CPU tensor torch's CPU rebuilders carry: still accepted."""
    sender, receiver = multiprocessing.Pipe()
    Channel(sender, from_backend=False).send({"out": torch.arange(10_000.0)})
    assert torch.equal(Channel(receiver, from_backend=True).recv()["out"], torch.arange(10_000.0))


@pytest.mark.parametrize("fields", [(torch.float32, (0, 8), 0), (torch.float32, (4, 8), 0), ("f", (0,), 0),
                                    (torch.float32, (0,), 1), (torch.float32, [0], 0), (torch.float32, (0,), -1)])
def test_an_empty_cuda_tensor_is_named_not_opened_and_checked(fields):
    """An empty answer has no allocation to name (the empty-tensor probe's): the reader makes one, once its dtype,
    a shape with no element and a device it has are checked; anything else is refused in one line."""
    handles = _Handles((), FakeOpener(), device_count=lambda: 1)
    if fields == (torch.float32, (0, 8), 0) and not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError)):  # well-formed: only torch without CUDA stops it
            handles.empty(*fields)
        return
    with pytest.raises(pickle.UnpicklingError, match="none this process has: refused$"):
        handles.empty(*fields)
