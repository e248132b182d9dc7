"""An equal machine for every timed backend (docs/integrity.md): while one backend's worker is timed, every other
backend's process is stopped; the timed worker's CPUs and priority are set by the run and checked after the round,
and its CPU time is held to its thread count. Linux's /proc and signals; elsewhere only what the OS offers."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

#: the CPU time a worker may take in a round: its threads x the round's wall x CPU_SHARE + CPU_SLACK_MS. The kernel
#: counts a process's time in clock ticks (USER_HZ, 10 ms), so a round is read to within a tick at each end
CPU_SHARE = 1.25
CPU_SLACK_MS = 30.0
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
_PROC = "/proc"


@dataclass(frozen=True)
class Placement:
    """Where and how a process's threads may run: the CPUs, the nice value, the scheduling policy (os.SCHED_*)."""

    cpus: frozenset[int]
    nice: int
    policy: int

    @classmethod
    def of_run(cls) -> "Placement | None":
        """The run's own process's placement (what every worker gets); None where the OS does not say."""
        try:
            return cls(frozenset(os.sched_getaffinity(0)), os.getpriority(os.PRIO_PROCESS, 0),
                       os.sched_getscheduler(0))
        except (AttributeError, OSError):
            return None


def threads_of(pid: int) -> list[int]:
    """The thread ids of process `pid` ([] when it is gone or /proc is not there)."""
    try:
        return [int(tid) for tid in os.listdir(f"{_PROC}/{pid}/task")]
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError, PermissionError):
        return []


def place(pid: int, placement: Placement) -> None:
    """Every thread of `pid` on the run's CPUs, at the run's nice value and policy, as far as the OS lets the run
    (raising a priority needs privileges; misplaced() says what was left)."""
    for tid in threads_of(pid):
        for step in (lambda: os.sched_setaffinity(tid, placement.cpus),
                     lambda: os.setpriority(os.PRIO_PROCESS, tid, placement.nice),
                     lambda: os.sched_getscheduler(tid) == placement.policy
                     or os.sched_setscheduler(tid, placement.policy, os.sched_param(0))):
            try:
                step()
            except (OSError, ValueError):  # a thread that just ended, or a change the OS refuses: checked after
                pass


def misplaced(pid: int, placement: Placement) -> str:
    """'' unless a thread of `pid` may run elsewhere than the run placed it: other CPUs, a lower priority, another
    scheduling policy - what a neighbour (or the process itself) changed."""
    for tid in threads_of(pid):
        try:
            cpus = frozenset(os.sched_getaffinity(tid))
            nice = os.getpriority(os.PRIO_PROCESS, tid)
            policy = os.sched_getscheduler(tid)
        except OSError:  # ended since it was listed
            continue
        if cpus != placement.cpus:
            return (f"thread {tid} of the worker was moved to CPU(s) {_cpus(cpus)} (the run placed it on "
                    f"{_cpus(placement.cpus)})")
        if nice != placement.nice:
            return f"thread {tid} of the worker runs at nice {nice} (the run's: {placement.nice})"
        if policy != placement.policy:
            return f"thread {tid} of the worker runs under scheduling policy {policy} (the run's: {placement.policy})"
    return ""


def _cpus(cpus: frozenset[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid`, every thread's, ended ones too (the kernel's own count, which no
    code in the process can rewrite); None when unreadable."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime: fields 14 and 15 of stat(5)


def busy_seconds() -> float | None:
    """CPU seconds every CPU of the machine spent busy since boot (/proc/stat), None when unreadable."""
    try:
        with open(f"{_PROC}/stat", "rb") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle, iowait
    return (sum(values[:8]) - idle) * _TICK_S  # guest time is already in user


def over_threads(cpu_s: float, wall_s: float, threads: int) -> str:
    """'' unless a worker took more CPU time in a round than its threads allow in the round's wall time."""
    allowed = threads * wall_s * CPU_SHARE + CPU_SLACK_MS / 1e3
    if cpu_s <= allowed:
        return ""
    return (f"the worker used {cpu_s * 1e3:.0f} ms of CPU in {wall_s * 1e3:.0f} ms of round on {threads} thread(s) "
            f"(allowed {allowed * 1e3:.0f} ms: {CPU_SHARE:g} x threads x wall + {CPU_SLACK_MS:g} ms); it ran work "
            f"beyond its threads")


def own_group() -> None:
    """Make this process (a worker, a plugin's host) the leader of a process group of its own, so that the run
    stops the processes its backend starts along with it (a child that leaves the group on purpose escapes: its CPU
    time shows in EqualMachine.others_share)."""
    try:
        os.setpgid(0, 0)
    except (AttributeError, OSError):
        pass


def stop(pids: list[int]) -> list[int]:
    """SIGSTOP each process's group (a worker leads its own: own_group), else the process; the ones stopped."""
    stopped = []
    for pid in pids:
        try:
            _signal_group(pid, signal.SIGSTOP)
            stopped.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return stopped


def wait_stopped(pids: list[int], timeout_s: float = 0.1) -> None:
    """Until every thread of `pids` is stopped (a SIGSTOP lands asynchronously: a thread inside a system call, e.g.
    a neighbour's sched_setaffinity, finishes it first), at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    pending = [(pid, tid) for pid in pids for tid in threads_of(pid)]
    while pending and time.monotonic() < deadline:
        pending = [(pid, tid) for pid, tid in pending if _state(pid, tid) not in (b"T", b"t", b"X", b"Z", None)]
        if pending:
            time.sleep(0.0002)


def _state(pid: int, tid: int) -> bytes | None:
    try:
        with open(f"{_PROC}/{pid}/task/{tid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def resume(pids: list[int]) -> None:
    for pid in pids:
        try:
            _signal_group(pid, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass


def _signal_group(pid: int, sig: int) -> None:
    try:
        if os.getpgid(pid) == pid:  # its own group: the plugin's own child processes are stopped with it
            os.killpg(pid, sig)
            return
    except (ProcessLookupError, PermissionError):
        raise
    except OSError:
        pass
    os.kill(pid, sig)


class EqualMachine:
    """Around one timed request: the others stopped, the timed worker placed, and afterwards `problem` (why the round
    cannot stand: '' when it can) and `others_share` (the share of the machine's CPU time that processes other than
    the worker and the run took during it: the load it ran beside, 0-1; None unread)."""

    def __init__(self, pid: int, others: list[int], placement: Placement | None, threads: int):
        self.pid, self.others, self.placement, self.threads = pid, others, placement, threads
        self.problem, self.others_share = "", None

    def __enter__(self) -> "EqualMachine":
        self._stopped = stop(self.others)
        wait_stopped(self._stopped)
        if self.placement is not None:
            place(self.pid, self.placement)
        self._start = (time.monotonic(), cpu_seconds(self.pid), cpu_seconds(os.getpid()), busy_seconds())
        return self

    def __exit__(self, *exc) -> None:
        end = (time.monotonic(), cpu_seconds(self.pid), cpu_seconds(os.getpid()), busy_seconds())
        try:
            wall = end[0] - self._start[0]
            if None not in (end[1], self._start[1]):
                self.problem = over_threads(end[1] - self._start[1], wall, self.threads)
            if self.placement is not None and not self.problem:
                self.problem = misplaced(self.pid, self.placement)
            if None not in end + self._start and wall > 0:
                others = (end[3] - self._start[3]) - (end[1] - self._start[1]) - (end[2] - self._start[2])
                self.others_share = min(1.0, max(0.0, others / (wall * (os.cpu_count() or 1))))
        finally:
            resume(self._stopped)
