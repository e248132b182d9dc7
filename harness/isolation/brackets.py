"""Each timed call bracketed by the run's own clocks (docs/integrity.md, issue 62 item 3): the worker asks before its
clock starts and reports after it stops, on a pipe of its own, and waits for the run's word each time; the run reads
its wall clock and the worker process's CPU clock (the kernel's count, in ns, which no process can rewrite) as it
lets the call start and as the report arrives."""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

from harness.measure.timing import CLOCKS

_TICK, _GO, _ACK = b"t", b"g", b"a"
_TOCK = struct.Struct("<qq")  # the worker's clock at the call's start and end (ns)


@dataclass(frozen=True)
class Bracket:
    """One timed call: the run's clock as it let the call start (`opened_ns`) and as the worker's report was read
    (`closed_ns`), the worker's own clock at the call's start and end as it reported them (one system-wide monotonic
    clock for both), and the CPU time the worker's process took in between, every thread (`cpu_ns`)."""

    opened_ns: int
    closed_ns: int
    start_ns: int
    end_ns: int
    cpu_ns: int


class Ticker:
    """The worker's end: `open` before a call's clock starts, `close` after it stops; each waits for the run."""

    def __init__(self, conn):
        self.conn = conn

    def open(self) -> None:
        self.conn.send_bytes(_TICK)
        if self.conn.recv_bytes() != _GO:
            raise RuntimeError("the run answered a call's bracket out of turn")

    def close(self, start_ns: int, end_ns: int) -> None:
        self.conn.send_bytes(_TOCK.pack(start_ns, end_ns))
        if self.conn.recv_bytes() != _ACK:  # the process waits, idle, while the run reads its CPU clock
            raise RuntimeError("the run answered a call's bracket out of turn")


def cpu_clock(pid: int) -> int:
    """The clock id of process `pid`'s CPU time, every thread (Linux: clock_getcpuclockid, CPUCLOCK_SCHED): any
    process may read another's with clock_gettime."""
    return ((~pid) << 3) | 2


class Brackets:
    """The run's end, for one worker: answers each bracket message and keeps the brackets of the current request."""

    def __init__(self, conn, pid: int):
        self.conn, self.clock = conn, cpu_clock(pid)
        self.taken: list[Bracket] = []
        self._opened = self._cpu = 0

    def serve(self) -> None:
        """One message from the worker: a call about to start (read both clocks, let it start) or a call's report
        (read both clocks, keep its bracket, let the worker go on)."""
        message = self.conn.recv_bytes()
        if message == _TICK:
            self._cpu, self._opened = time.clock_gettime_ns(self.clock), CLOCKS.now_ns()
            self.conn.send_bytes(_GO)
            return
        closed, cpu = CLOCKS.now_ns(), time.clock_gettime_ns(self.clock)
        start, end = _TOCK.unpack(message)
        self.taken.append(Bracket(self._opened, closed, start, end, cpu - self._cpu))
        self.conn.send_bytes(_ACK)
