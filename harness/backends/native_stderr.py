"""What native (C++) code writes to file descriptor 2 during a block, captured instead of reaching the terminal."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import Iterator


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Point fd 2 at a temporary file meanwhile (C++ writes there, below Python's sys.stderr); the yielded list
    fills with what was written, line by line, when the block ends."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode(errors="replace").splitlines())
