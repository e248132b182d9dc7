"""A backend that dies by a signal on empty sequences, as compiled flex does on CPU: loaded only by the
empty-tensor child process (tests/test_edge_cases.py), so the test session's own registry never sees it."""

import os
import signal

from harness import Backend, register
from harness.backends.naive import Naive


@register
class CrashOnEmptySequence(Backend):
    name = "crash-on-empty-seq"

    def forward(self, q, k, v, *, mask, scale):
        if q.shape[2] == 0 or k.shape[2] == 0:
            os.kill(os.getpid(), signal.SIGSEGV)
        return Naive().forward(q, k, v, mask=mask, scale=scale)
