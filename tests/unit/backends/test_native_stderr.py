"""harness.backends.native_stderr.captured_stderr: what C code writes to fd 2 inside the block is read back."""

import os

import pytest

from harness.backends.native_stderr import captured_stderr


def test_captured_stderr_gives_back_what_c_code_wrote_even_when_the_block_raises(capfd):
    with pytest.raises(RuntimeError):
        with captured_stderr() as lines:
            os.write(2, b"kineto: profiler started\n")
            raise RuntimeError("kernel refused")
    assert lines == ["kineto: profiler started"] and capfd.readouterr().err == ""
    os.write(2, b"after\n")  # fd 2 is the terminal's again
    assert capfd.readouterr().err == "after\n"
