"""A timed round's clock audit in the run's process (docs/integrity.md); its answers are judged in judge.py, and the
worker's side is calls/round.py."""

from __future__ import annotations

import secrets
import statistics
from dataclasses import dataclass, replace

import torch

#: the clock audit (clock_disagreement): a round is rejected when the run's own clock saw it last longer than the timing
#: process's clocks account for by over CLOCK_SHARE of the round plus CLOCK_SLACK_MS - what a request's trip through the
#: pipe and the scheduler adds: median 12 ms, 99th percentile 54-61 ms, at most 110 ms in 864 honest rounds at a load
#: average of 8-18 on 2 cores (benchmarks/clock_audit_study.py, 2026-12-03); a disagreeing round is timed again, up to
#: CLOCK_TRIES rounds in all: at a load of 9-12 from busy processes 1 round in 144 disagreed (2026-12-04), and a
#: round and its one retry both did once in the README's main job run beside CI
CLOCK_SHARE = 0.5
CLOCK_SLACK_MS = 100.0
CLOCK_TRIES = 3
#: the bracket audit (bracket_audit): each CPU call's CPU time by the kernel's count, over the run's bracket of it and
#: shared over the worker's threads, may exceed the worker's own reading of the call, at the median over a round's
#: samples, by CPU_SLACK_MS + CPU_SHARE x the median sample: the worker's own steps inside the bracket (a wake-up, a
#: report) and its thread pool spinning on after a call (benchmarks/bracket_gaps.py); with more than one thread,
#: STALE_MS more: a thread still running when the run reads the clock has its time folded in only at the next scheduler
#: tick (4 ms at this VM's CONFIG_HZ=250), where a worker of one thread is idle, waiting for the run, at both readings
CPU_SLACK_MS = 0.1
CPU_SHARE = 0.25
STALE_MS = 4.0
#: Beside other load a worker of several threads can exceed that honestly: after each call its OpenMP pool spins on,
#: ~10 ms of CPU a thread with libgomp's default wait policy (torch 2.13 CPU), counted whenever the run reads the
#: bracket late. A round whose CPU time over the limit is at most what its other threads could spin while the run and
#: the worker's main thread waited for a CPU (the median bracket's waited_ns x (threads - 1) / threads) is not
#: auditable at this load: it gives no figure, and no verdict either (Audit.loaded: not timed, never rejected) - an
#: A/A gate at load 9 on 2 CPUs rejected 3 of 30 honest keys so (calls read at 2-9 ms with 11-16 ms a thread of CPU
#: time, 2026-12-07). On a quiet machine, or with one thread, the rule stands as above.
#: A call that waits rather than computes (a sleep, work in another process) has little CPU time to bound it: its
#: bracket by the run's wall clock may exceed the worker's reading, at the median, by WALL_SLACK_MS + WALL_SHARE x the
#: bracket, less the machine's waits (Bracket.run_waited_ns, worker_waited_ns: a loaded scheduler's wake-ups - at load
#: 7.7 on 2 CPUs honest brackets of 29 ms around 7.7 ms readings, 2026-12-07). A busy call is bounded beside load by
#: its main thread's time running or waiting for a CPU, which its reading must hold but for the CPU rule's slack. The
#: worker's wait counts as the machine's only up to the run's in the same bracket (with min(WAKE_SHARE, WAKE_SPREAD /
#: sqrt(samples)) x the run's median wake-up more in both rules): its count holds its waits inside the call too, which
#: excused in full let a busy clock reading a quarter of a 20 ms call pass at load 11 (QuarterEnd, 2026-12-07). A
#: round that agrees only with all of it excused is loaded.
WALL_SLACK_MS = 5.0
WALL_SHARE = 0.5
WAKE_SHARE = 2.0
WAKE_SPREAD = 6.0
#: the same on CUDA between the events' span over the repetitions and the host clock around them, in one process after
#: synchronisation: only the first launch and the last synchronisation are the host's alone
EVENT_SLACK_MS = 5.0

def clock_disagreement(claimed_ms: float, accounted_ms: float, wall_ms: float,
                       clocks: str = "the backend process's clock disagrees with the run's",
                       slack_ms: float = CLOCK_SLACK_MS) -> str:
    """'' unless the run's clock saw the round (wall_ms, around its request) last longer than the timing process
    accounts for (accounted_ms: its work outside `measure`, measure's besides the samples, and the samples, each by
    its own clock) by over CLOCK_SHARE x accounted_ms + CLOCK_SLACK_MS; claimed_ms: the samples' sum. A clock slowed
    s-fold claims 1/s of every part it reads, so the run sees up to (s - 1) x accounted_ms more: rejected once
    (s - 1 - CLOCK_SHARE) x accounted_ms passes CLOCK_SLACK_MS - a 5x clock of every part on any round of over 143 ms
    of real work (a shorter one's lag is caught by clock_behind as the next request starts). On CUDA the same rule,
    with EVENT_SLACK_MS, holds the events' span over the repetitions to the host clock around them (any round of over
    7 ms with events slowed 5x)."""
    unseen = wall_ms - accounted_ms
    if unseen <= CLOCK_SHARE * accounted_ms + slack_ms:
        return ""
    return (f"{clocks}: {claimed_ms:.3g} ms claimed in {claimed_ms + unseen:.3g} ms of calls (the round: "
            f"{accounted_ms:.4g} ms by the first, {wall_ms:.4g} ms by the second; limit {CLOCK_SHARE:g} x the round + "
            f"{slack_ms:g} ms)")


@dataclass(frozen=True)
class Audit:
    """A timed round's clock audit: `problem` ('' when the clocks agree) and `loaded`, when the machine's load can
    explain it (the bracket audit's CPU rule above): the round then has no figure, and is not rejected."""

    problem: str = ""
    loaded: bool = False


def bracket_audit(brackets: list, samples_ms, threads: int) -> str:
    """bracket_problem's reason alone: '' when the brackets agree with the worker's readings."""
    return bracket_problem(brackets, samples_ms, threads).problem


def bracket_problem(brackets: list, samples_ms, threads: int) -> Audit:
    """No problem unless the worker's reading of its timed calls disagrees with the run's bracket of each (isolation/
    brackets.py): a call read outside its bracket (one monotonic clock: never, honestly), samples that are not the
    bracketed calls' readings, or, at the median over the samples, the run's wall bracket above the reading by over
    WALL_SLACK_MS + WALL_SHARE x the bracket, or CPU time above the reading by over CPU_SLACK_MS (+ STALE_MS with more
    than one thread) + CPU_SHARE x the median sample: the process's over the bracket / `threads` (it cannot run more
    than that many threads at once for one second of its call), and the worker's main thread's time running or
    waiting for a CPU (a busy call is runnable all through it, however long the scheduler keeps it waiting). A clock
    that reads a sample short claims less time than the call kept its threads busy or waiting to be.

    The scheduler's waits in a bracket are the machine's: the run's, and the worker's outside its call - which only
    the run's, one wake-up in the same bracket, bounds (the worker's count holds its waits inside the call too). A
    round that agrees only once all the worker's wait is excused, or whose CPU time over the limit its other threads
    could have spun while the machine kept it waiting, is not auditable at this load (loaded: no figure, no verdict)."""
    for b in brackets:
        if not b.opened_ns <= b.start_ns <= b.end_ns <= b.closed_ns:
            start, end, closed = ((t - b.opened_ns) / 1e6 for t in (b.start_ns, b.end_ns, b.closed_ns))
            return Audit(f"the backend process's clock read a call outside the run's bracket of it ({start:.4g} ms "
                         f"after it opened to {end:.4g} ms; the bracket closed at {closed:.4g} ms)")
    samples = list(samples_ms)
    timed = brackets[len(brackets) - len(samples):] if len(brackets) >= len(samples) else []
    if [(b.end_ns - b.start_ns) / 1e6 for b in timed] != samples:
        return Audit(f"the backend process returned {len(samples)} samples that are not its readings of the "
                     f"{len(brackets)} calls the run bracketed")
    if not samples:
        return Audit()
    _, bound, _ = _disagreement(timed, samples, threads, lambda b: min(b.worker_waited_ns, b.run_waited_ns))
    if not bound:
        return Audit()
    rule, every, excess = _disagreement(timed, samples, threads, lambda b: b.worker_waited_ns)
    if not every:
        return Audit(f"{bound}, the worker's wait counted up to the run's: not auditable at this load", loaded=True)
    # the pool's spin shows in the main thread's time too, at an OpenMP barrier for a thread kept waiting (an honest
    # round at load 22 on 2 CPUs: calls read at 1.8 ms, the main thread running 22-30 ms in the setup between them)
    spun = (threads - 1) / threads * statistics.median(b.waited_ns for b in timed) / 1e6
    if rule == "wall" or excess > spun:
        return Audit(every)
    return Audit(f"{every}, within what its other threads could spin while {spun * threads / (threads - 1):.3g} ms "
                 f"went waiting for a CPU: not auditable at this load", loaded=True)


def _cpu_over(timed: list, samples: list, threads: int) -> tuple[float, float]:
    """(the process's CPU time a thread over the reading, at the median; its limit), ms."""
    over = statistics.median(b.cpu_ns / threads - (b.end_ns - b.start_ns) for b in timed) / 1e6
    return over, CPU_SLACK_MS + (STALE_MS if threads > 1 else 0.0) + CPU_SHARE * statistics.median(samples)


def _disagreement(timed: list, samples: list, threads: int, excused) -> tuple[str, str, float]:
    """(the rule, its reason, by how many ms it exceeds its limit; '', '' and 0 when none) where the brackets `timed`
    disagree with their readings `samples` (bracket_problem's rules), the run's wait and excused(bracket) ns of the
    worker's main thread's counted as the machine's, the rest of the worker's as its call's."""
    median = statistics.median(samples)
    rest = [b.run_waited_ns + excused(b) for b in timed]
    # the worker's wake-up is the run's to bound, bracket by bracket: the median over n samples of the difference of
    # two such waits strays by ~ their mean / sqrt(n) (exponential waits), so up to WAKE_SPREAD / sqrt(n) - at most
    # WAKE_SHARE - x the run's median wake-up more
    share = min(WAKE_SHARE, WAKE_SPREAD / len(timed) ** 0.5)
    woken = share * statistics.median(b.run_waited_ns for b in timed) / 1e6
    waking = f"{woken:.3g} ms, {share:.2g} x the run's wake-up"
    reads = f"the backend process's clock reads {median:.4g} ms of a call"
    counted = f"medians over {len(samples)} samples"
    seen = statistics.median(b.closed_ns - b.opened_ns - e for b, e in zip(timed, rest)) / 1e6
    gap = statistics.median(b.closed_ns - b.opened_ns - e - (b.end_ns - b.start_ns) for b, e in zip(timed, rest))
    if gap / 1e6 > WALL_SLACK_MS + WALL_SHARE * seen + woken:
        waited = statistics.median(rest) / 1e6
        return "wall", (f"{reads} the run's clock saw take {seen:.4g} ms besides {waited:.3g} ms "
                        f"waiting for a CPU ({counted}; limit {WALL_SLACK_MS:g} ms + {WALL_SHARE:g} x the run's + "
                        f"{waking})"), 0.0
    over, limit = _cpu_over(timed, samples, threads)
    rule = f"{counted}, by the kernel's count; limit {limit - CPU_SHARE * median:g} ms + {CPU_SHARE:g} x the reading"
    # a busy call's main thread is running or waiting for a CPU all through it
    held = statistics.median(b.worker_ran_ns + b.worker_waited_ns - excused(b) - (b.end_ns - b.start_ns)
                             for b in timed) / 1e6
    if held > limit + woken:
        return "held", (f"{reads} whose thread ran or waited for a CPU {held:.4g} ms more than that ({rule} + "
                        f"{waking})"), held - limit - woken
    if over > limit:
        busy = statistics.median(b.cpu_ns / threads for b in timed) / 1e6
        return "cpu", f"{reads} that kept its {threads} thread(s) busy {busy:.4g} ms ({rule})", over - limit
    return "", "", 0.0


def clock_behind(started_ns: int, asked_ns: int) -> str:
    """'' unless the timing process's clock read `started_ns` as the round started, before the run's read `asked_ns`
    as it sent the request (one system-wide monotonic clock: never, honestly). A clock slowed at any point since the
    process started - at import, in a call - lags real time by what it slowed, and nothing of the kernel runs between
    a reply and the next request to catch up: any lag over the request's trip shows at the next round."""
    if started_ns >= asked_ns:
        return ""
    return (f"the backend process's clock is behind the run's: the round started {(asked_ns - started_ns) / 1e6:.4g} "
            f"ms before the run asked for it")


def audited_time(executor, backend, timing, device: torch.device):
    """(a round timed where the backend runs, its clock audit: '' when the clocks agree, or the round failed); the
    answer's `seed` is the one its round's contents were made from (each retry draws its own: a round timed again
    on contents the kernel has seen would be a memo's to answer)."""
    answer = executor.time(backend, timing, device)
    for _ in range(CLOCK_TRIES - 1):
        if answer.failure is not None or not clock_audit(answer).problem:
            break
        # a reply held up by a loaded scheduler is not a slowed clock, which disagrees on every round; the figure kept
        # is always an agreeing round's, so a clock slowed on some rounds only gains nothing
        timing = replace(timing, seed=secrets.randbits(63))
        answer = executor.time(backend, timing, device)
    answer.seed = timing.seed
    return answer, Audit() if answer.failure is not None else clock_audit(answer)


def clock_audit(answer) -> Audit:
    """A timed round's (timed.TimingResult) clock audit in the run's process: the worker's clock against the run's
    around the round (clock_behind, the brackets, clock_disagreement), and on CUDA the events against the host clock
    around the repetitions."""
    claimed = sum(answer.measurement.samples_ms)
    events = answer.measurement.event_vs_host
    behind = answer.asked_ns is not None and clock_behind(answer.started_ns, answer.asked_ns)
    brackets = (Audit() if answer.witness is None or behind else
                bracket_problem(list(answer.witness.brackets), answer.measurement.samples_ms, answer.witness.threads))
    if brackets.problem and not brackets.loaded:
        return brackets
    other = (behind or (answer.wall_ms is not None and clock_disagreement(claimed, answer.accounted_ms, answer.wall_ms))
             or (events is not None and clock_disagreement(
                 claimed, *events, "the device's events disagree with the host clock after synchronisation",
                 EVENT_SLACK_MS)))
    # unauditable only where every other check passed: the load explains nothing else
    return Audit(other) if other else brackets
