"""A process of the run's own (a backend's worker, a plugin module's host), from both ends: the run starts it with a
pipe, asks through the wire's Channel with a time-out and stops it; the child answers each request until stopped."""

from __future__ import annotations

import multiprocessing.connection
import pickle
import signal
from typing import Any, Callable

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
    """The run's end of one child process started from the workers' forkserver: `target(conn, *args)` runs there."""

    def __init__(self, target: Callable[..., None], args: tuple, name: str):
        ctx = worker_context()
        self.conn, end = ctx.Pipe(duplex=True)
        self.channel = Channel(self.conn, from_backend=True)
        self.process = ctx.Process(target=target, args=(end, *args), name=name, daemon=True)
        self.process.start()
        end.close()
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
