"""harness.calls.outcome: how an exception becomes a status and one line, and what a result keeps."""

import torch

from harness.backends.base import BackwardUnsupported, Unsupported
from harness.calls.outcome import BackendResult, Failure
from harness.store.schema import ERROR, OOM, UNSUPPORTED


def test_a_verdict_kept_for_later_stages_holds_no_tensors():
    big = torch.zeros(1000)
    result = BackendResult([], {}, out=big, grads={"dq": big})
    kept = result.released()
    assert kept.out is None and not kept.grads and kept.rows is result.rows


def test_each_exception_becomes_its_status_and_one_line():
    assert Failure.of(Unsupported("head_dim=512: allowed <= 256")) == Failure(UNSUPPORTED, "head_dim=512: allowed <= 256")
    assert Failure.of(torch.OutOfMemoryError("CUDA out of memory. Tried 2 GiB\nmore")) == Failure(
        OOM, "out of memory: CUDA out of memory. Tried 2 GiB")
    assert Failure.of(ValueError("bad\nsecond line")) == Failure(ERROR, "ValueError: bad")


def test_keyboard_interrupt_and_system_exit_inside_a_backend_are_errors_and_only_the_first_stops_the_run():
    interrupted = Failure.of(KeyboardInterrupt())
    assert (interrupted.status, interrupted.interrupted) == (ERROR, True)
    exited = Failure.of(SystemExit(3))
    assert (exited.status, exited.reason, exited.interrupted) == (ERROR, "SystemExit(3) raised inside the backend call",
                                                                   False)
    backward = Failure.of(BackwardUnsupported("no backward for this mask"))
    assert (backward.status, backward.backward_only) == (UNSUPPORTED, True)
