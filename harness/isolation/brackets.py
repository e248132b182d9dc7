"""Each timed call bracketed by the run's own clocks (docs/integrity.md, issue 62 item 3): the worker asks before its
clock starts and reports after it stops, on a pipe of its own, and waits for the run's word each time; the run reads
its wall clock and the worker process's CPU clock (the kernel's count, in ns, which no process can rewrite) as it
lets the call start and as the report arrives (a call that does not ask - on several threads, right after a bracketed
one - is bracketed from the last report). The report carries the checksums of the call's answers, read inside
its timed region; the run's word after it says whether to keep the call's answers to be judged (the run's own draw,
made only then) and carries the next call's nonce, drawn by `secrets` only then: no call's content is known before
the call before it has been timed, and no answer can be changed once the run knows it will be judged."""

from __future__ import annotations

import os
import secrets
import struct
import threading
import time
from dataclasses import dataclass

from harness.measure.timing import CLOCKS

_TICK, _TOCK, _NONCE, _GO, _ACK, _ACK_TICK = b"t", b"r", b"n", b"g", b"a", b"k"
#: the checksums a report carries, by quantity, in this order (which are there: a bit each)
SUMMED = ("out", "dq", "dk", "dv", "dsinks", "dbias")
#: the worker's message, every kind one size (raw reads of a fixed length on the socket, no framing: ~10 us a
#: message less than a Connection's): its kind; for a report, its clock at the call's start and end (ns), which
#: answers it read, their checksums
_ASK = struct.Struct("<cqqB6q")
#: the run's word: go (a call may start), or ack after a report - _ACK_TICK: and ask before the next call even right
#: after this one - with the slot to keep its answers in (-1: not kept), the next call's nonce
_WORD = struct.Struct("<cbQ")


def _read(fd: int, size: int) -> bytes:
    """`size` bytes from the socket `fd` (EOFError when it closed first)."""
    data = os.read(fd, size)
    while len(data) < size:
        more = os.read(fd, size - len(data))
        if not more:
            raise EOFError("the other end of a bracket pipe closed")
        data += more
    return data


@dataclass(frozen=True)
class Bracket:
    """One timed call: the run's clock as it let the call start, or at the last report when the call did not ask
    (`opened_ns`), and as the worker's report was read (`closed_ns`), the worker's own clock at the call's start and end
    as it reported them (one system-wide monotonic clock for both), and the CPU time the worker's process took in
    between, every thread (`cpu_ns`)."""

    opened_ns: int
    closed_ns: int
    start_ns: int
    end_ns: int
    cpu_ns: int
    #: the checksums of the call's answers, by quantity, as its report carried them (read inside its timed region)
    sums: tuple = ()
    #: the scheduler's counts between the two readings (Waits, /proc/<tid>/schedstat): ns the worker's main thread,
    #: which reads the clock and reports, spent runnable but not running (waiting for a CPU: run_delay), and running;
    #: ns the run's thread waited for a CPU - the machine's, never the call's
    worker_waited_ns: int = 0
    worker_ran_ns: int = 0
    run_waited_ns: int = 0

    @property
    def waited_ns(self) -> int:
        """ns the worker's main thread and the run's waited for a CPU between the two readings."""
        return self.worker_waited_ns + self.run_waited_ns


@dataclass(frozen=True)
class Witnessed:
    """What the run's process saw of a timed round in a worker: each renewed call's bracket and the nonce it gave it
    (in order: call i's are the i-th), the calls it drew to be judged (their indices: a uniform draw of `keep` among
    all, the reservoir's), and the threads the worker was given."""

    brackets: tuple
    nonces: tuple
    kept: tuple
    threads: int

class Ticker:
    """The worker's end: `open` before a call's clock starts, `close` after it stops; each waits for the run."""

    def __init__(self, conn):
        self.conn, self.fd = conn, conn.fileno()
        self._nonce: int | None = None  # the next call's, as the run's last word gave it
        self._tick = False  # the run's last word asked the next call to ask, even right after this one

    def begin(self) -> None:
        """A new round: the nonce the last round's last word gave is not this round's (the run gives a round's
        nonces anew, in order, from its first call's)."""
        self._nonce = None
        self._tick = False

    def _ask(self, kind: bytes, *report) -> tuple:
        os.write(self.fd, _ASK.pack(kind, *(report or (0, 0, 0, 0, 0, 0, 0, 0, 0))))
        return _WORD.unpack(_read(self.fd, _WORD.size))

    def nonce(self) -> int:
        """The next call's nonce (its content's offsets hash it): the run's, given with its word after the last
        call, or asked for now (a round's first)."""
        if self._nonce is None:
            self._nonce = self._ask(_NONCE)[2]
        nonce, self._nonce = self._nonce, None
        return nonce

    def open(self, adjacent: bool = False) -> None:
        """Before a call's clock starts: the run reads its clocks and lets it start - or, `adjacent`, nothing is
        asked and the call's bracket opens where the run's last reading was taken (the last call's report, or the
        round's first nonce; brackets.Brackets), holding all the worker did since, unless the run's last word said
        to ask. A worker that skips this only widens its own brackets."""
        if (not adjacent or self._tick) and self._ask(_TICK)[0] != _GO:
            raise RuntimeError("the run answered a call's bracket out of turn")

    def close(self, start_ns: int, end_ns: int, sums: dict[str, int]) -> int:
        """Report the call (its clock's readings, its answers' checksums); the slot the run says to keep its
        answers in, -1 for none."""
        present = sum(1 << i for i, quantity in enumerate(SUMMED) if quantity in sums)
        # idle while the run reads its CPU clock
        word, slot, self._nonce = self._ask(_TOCK, start_ns, end_ns, present, *(sums.get(q, 0) for q in SUMMED))
        if word not in (_ACK, _ACK_TICK):
            raise RuntimeError("the run answered a call's bracket out of turn")
        self._tick = word == _ACK_TICK
        return slot


#: a worker that waited longer for a CPU in a bracket is asked before every later call (Brackets.serve): a scheduler
#: tick here (CONFIG_HZ=250), past the waits of a machine busy with the run alone - the main job's pairs were 1.026x
#: over their totals with ticks from 1 ms (load 2-3.5 on 2 CPUs, 2026-12-07), one more round trip a call
TICK_AFTER_WAIT_NS = 4_000_000
#: how many times the run looks for the worker to be waiting before it reads the CPU clock anyway (a few us each)
SETTLE_LOOKS = 1000


def cpu_clock(pid: int) -> int:
    """The clock id of process `pid`'s CPU time, every thread (Linux: clock_getcpuclockid, CPUCLOCK_SCHED): any
    process may read another's with clock_gettime."""
    return ((~pid) << 3) | 2


class Waits:
    """The scheduler's counts (/proc/<tid>/schedstat: ns running, ns runnable but waiting for a CPU - run_delay) of
    the worker's main thread, which reads the clock and reports, and of the thread that reads them; zeros where Linux
    keeps no such count. A thread that sleeps, or waits on another process, accrues no wait: what a call's wall
    bracket may be excused by is the machine's contention alone - the worker's own wait only outside its call, which
    the run's wake-up, sampling the same scheduler at the same moment, bounds (run/audit.py)."""

    def __init__(self, pid: int):
        self._fds = {"worker": _open(f"/proc/{pid}/schedstat")}  # the thread-group leader: the worker's main thread

    def _fields(self, name: str) -> tuple[int, int]:
        fd = self._fds[name]
        try:
            ran, waited = os.pread(fd, 128, 0).split()[:2] if fd is not None else (0, 0)
            return int(ran), int(waited)
        except (OSError, ValueError):
            return 0, 0

    def worker(self) -> tuple[int, int]:
        """(the worker's main thread's ns running, ns waiting for a CPU): its running time is exact once it waits for
        the run (Brackets._settle), a running thread's is folded in up to a tick late."""
        return self._fields("worker")

    def run(self) -> int:
        """The reading thread's ns waiting for a CPU."""
        me = f"run {threading.get_native_id()}"  # the thread that reads: the one serving the brackets
        if me not in self._fds:
            self._fds[me] = _open("/proc/thread-self/schedstat")
        return self._fields(me)[1]

    def close(self) -> None:
        for fd in self._fds.values():
            if fd is not None:
                os.close(fd)
        self._fds.clear()


def _open(path: str) -> int | None:
    try:  # kept open: a pread is a few us, an open and read of /proc ~15
        return os.open(path, os.O_RDONLY)
    except OSError:
        return None


class Brackets:
    """The run's end, for one worker: answers each bracket message and keeps the brackets and the nonces it gave out
    for the current request."""

    def __init__(self, conn, pid: int, keep: int):
        self.conn, self.fd, self.clock, self.keep = conn, conn.fileno(), cpu_clock(pid), keep
        self._stat = _open(f"/proc/{pid}/stat")
        self.waits = Waits(pid)
        self.ticking = False  # every call asks before it starts, from the first time the worker waited (serve)
        self.clear()

    def clear(self) -> None:
        #: the current request's brackets; the nonces given out, in order (the k-th is the k-th renewed call's);
        #: the calls drawn to be judged, by slot (a reservoir of `keep`: each of the t calls so far kept alike)
        self.taken, self.nonces, self.kept = [], [], []
        #: the run's last reading of its wall clock and the worker's CPU clock, the worker waiting: where the next
        #: bracket opens unless a tick comes first (None: none yet this request)
        self._opened: int | None = None
        self._cpu: int | None = None
        #: the scheduler's counts at that reading: the worker's main thread's ns running and waiting, and the run's
        #: wait once its word was written (a worker woken on its CPU may hold it, runnable, through the whole call:
        #: that wait delays no reading)
        self._worker: tuple[int, int] = (0, 0)
        self._run_waited: int = 0

    def witnessed(self, threads: int) -> Witnessed:
        return Witnessed(tuple(self.taken), tuple(self.nonces), tuple(self.kept), threads)

    def _settle(self) -> None:
        """Wait until the worker waits for the run's word: a running thread's CPU time is folded into the process's
        clock only when it stops running (or at a scheduler tick, up to 4 ms late here), a waiting one's is exact."""
        for _ in range(SETTLE_LOOKS if self._stat is not None else 0):
            try:
                state = os.pread(self._stat, 512, 0).rpartition(b")")[2][1:2]
            except OSError:
                return
            if state in (b"S", b"D"):
                return
            os.sched_yield()

    def close(self) -> None:
        self.conn.close()
        self.waits.close()
        if self._stat is not None:
            os.close(self._stat)
            self._stat = None

    def _slot(self, call: int) -> int:
        """The run's draw, made as call `call` (1-based) is reported: Algorithm R keeps each of the calls so far
        with odds keep / call."""
        if len(self.kept) < self.keep:
            self.kept.append(call)
            return len(self.kept) - 1
        slot = secrets.randbelow(call)
        if slot >= self.keep:
            return -1
        self.kept[slot] = call
        return slot

    def _nonce(self) -> int:
        self.nonces.append(secrets.randbits(63))
        return self.nonces[-1]

    def serve(self) -> None:
        """One message from the worker: a round's first nonce asked for or a call about to start (read both clocks
        once it waits, answer), or a call's report (read both clocks, keep its bracket - from the last reading to
        this one - and let the worker go on with the next call's nonce)."""
        kind, start, end, present, *sums = _ASK.unpack(_read(self.fd, _ASK.size))
        if kind in (_NONCE, _TICK):
            self._settle()
            self._cpu, self._worker = time.clock_gettime_ns(self.clock), self.waits.worker()
            self._opened = CLOCKS.now_ns()
            os.write(self.fd, _WORD.pack(_GO, -1, 0) if kind == _TICK else _WORD.pack(_NONCE, -1, self._nonce()))
        elif kind == _TOCK:
            if self._opened is None:
                raise ValueError("the worker reported a call before the run read its clocks for the round")
            closed, run_waited, worker_waited = CLOCKS.now_ns(), self.waits.run(), self.waits.worker()[1]
            self._settle()
            cpu, worker = time.clock_gettime_ns(self.clock), self.waits.worker()
            summed = tuple((q, s) for i, (q, s) in enumerate(zip(SUMMED, sums)) if present >> i & 1)
            self.taken.append(Bracket(self._opened, closed, start, end, cpu - self._cpu, summed,
                                      worker_waited - self._worker[1], worker[0] - self._worker[0],
                                      run_waited - self._run_waited))
            # an adjacent call's bracket opens here
            self._opened, self._cpu, self._worker = closed, cpu, (worker[0], worker_waited)
            # once the worker was kept waiting for a CPU every later call asks: the content and setup between two
            # calls then lie outside their brackets, which bounds its wait by one wake-up (run/audit.py) - at load 11
            # and 22 on 2 CPUs brackets held 60-400 ms of them, waiting, after brackets that had waited for nothing
            # (2026-12-07)
            self.ticking = self.ticking or self.taken[-1].worker_waited_ns > TICK_AFTER_WAIT_NS
            os.write(self.fd, _WORD.pack(_ACK_TICK if self.ticking else _ACK, self._slot(len(self.taken)),
                                         self._nonce()))
        else:
            raise ValueError(f"the worker sent a bracket message of kind {kind!r}, not a nonce, tick or report")
        self._run_waited = self.waits.run()
