"""A process of the run's own (a backend's worker, a plugin module's host), from both ends: the run starts it with a
pipe, asks through the wire's Channel with a time-out and stops it; the child answers each request until stopped."""

from __future__ import annotations

import multiprocessing.connection
import pickle
import select
import signal
from typing import Any, Callable

from harness.isolation.brackets import Brackets
from harness.isolation.neighbours import own_group
from harness.isolation.wire import Channel, worker_context
from harness.measure.timing import CLOCKS

#: seconds a child may take to start: import torch, then the backend's or the plugin's module
START_TIMEOUT_S = 180.0
#: why no reply came (Gone.why)
TIMED_OUT, ENDED, REFUSED = "timed out", "ended", "refused"


class Gone(Exception):
    """No reply: the time-out passed (the child was killed), the child ended (`exitcode`), or it sent what no
    honest child sends (REFUSED, the unpickling error's text: killed, it is not trusted again)."""

    def __init__(self, why: str, exitcode: int | None = None, text: str = ""):
        super().__init__(text or why)
        self.why, self.exitcode, self.text = why, exitcode, text


class Child:
    """The run's end of one child process started from the workers' forkserver: `target(conn, *args)` runs there;
    bracketed (the answers a round keeps to be judged, > 0): `target(conn, clock_conn, *args)`, clock_conn the
    worker's end of the pipe its timed calls are bracketed on (brackets.py), answered here while a request is out
    (`ask`)."""

    def __init__(self, target: Callable[..., None], args: tuple, name: str, bracketed: int = 0):
        ctx = worker_context()
        self.conn, end = ctx.Pipe(duplex=True)
        self.channel = Channel(self.conn, from_backend=True)
        clock_conn, clock_end = ctx.Pipe(duplex=True) if bracketed else (None, None)
        ends = (end,) if clock_end is None else (end, clock_end)
        self.process = ctx.Process(target=target, args=(*ends, *args), name=name, daemon=True)
        self.process.start()
        for e in ends:
            e.close()
        #: the run's end of the brackets pipe (None: not bracketed)
        self.brackets = None if clock_conn is None else Brackets(clock_conn, self.process.pid, bracketed)
        #: the run's clock when the last reply arrived, before it was read (reading it is the run's own work)
        self.arrived_ns: int | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process.is_alive() else None

    def send(self, message: Any) -> None:
        """OSError or ValueError when the child is gone."""
        self.channel.send(message)

    def receive(self, timeout: float) -> Any:
        """The child's next message, or Gone."""
        ready = multiprocessing.connection.wait([self.conn, self.process.sentinel], timeout)
        self.arrived_ns = CLOCKS.now_ns()
        if self.conn in ready:
            try:
                return self.channel.recv()
            except (EOFError, OSError):
                pass
            except pickle.UnpicklingError as exc:
                self.kill()
                raise Gone(REFUSED, text=str(exc)) from None
        if not ready:
            self.kill()
            raise Gone(TIMED_OUT)
        self.process.join(timeout=5)
        raise Gone(ENDED, self.process.exitcode)

    def ask(self, message: Any, timeout: float) -> Any:
        """Send `message` and return the reply (Gone as `receive`; OSError or ValueError when the child is gone
        before it), each timed call's bracket answered on the way (`brackets.taken`, `nonces`: cleared first); `timeout`
        bounds the whole exchange."""
        deadline = CLOCKS.now_ns() + int(timeout * 1e9)
        self.send(message)
        if self.brackets is None:
            return self.receive(timeout)
        self.brackets.clear()
        # one poll set for the exchange (multiprocessing's wait builds a selector each time: ~4 us a message more)
        watched = select.poll()
        for fd in (self.conn.fileno(), self.brackets.fd, self.process.sentinel):
            watched.register(fd, select.POLLIN)
        while True:
            left = max(0.0, (deadline - CLOCKS.now_ns()) / 1e9)
            ready = {fd for fd, _ in watched.poll(left * 1e3)}
            if self.brackets.fd not in ready or self.conn.fileno() in ready:
                return self.receive(left)  # the reply, the child gone, or the time-out
            try:
                self.brackets.serve()
            except (EOFError, OSError):
                return self.receive(left)
            except ValueError as exc:
                self.kill()
                raise Gone(REFUSED, text=str(exc)) from None

    def stop(self) -> None:
        """Ask it to stop (it finishes what it is doing), then kill what is left."""
        try:
            self.channel.send(("stop", None))
            self.process.join(timeout=5)
        except (OSError, ValueError):
            pass
        self.kill()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=10)
        self.conn.close()
        if self.brackets is not None:
            self.brackets.close()


def child_channel(conn) -> Channel:
    """The child's first step, before any backend or plugin code runs: Ctrl-C is the run's to handle, and what the
    child starts is stopped with it (a process group of its own: neighbours.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    own_group()
    return Channel(conn, from_backend=False)


def serve(channel: Channel, answer: Callable[[str, Any], Any], after: Callable[[], None] = lambda: None) -> None:
    """The child's loop: each request's answer sent back, then `after()`, until "stop" or the run is gone."""
    while True:
        try:
            kind, payload = channel.recv()
        except (EOFError, OSError):
            return
        if kind == "stop":
            return
        channel.send(answer(kind, payload))  # the reply is dropped before the next request is read
        after()
