"""What the timing integrity checks cost (docs/integrity.md): a key timed as the main job times it (--rounds rounds,
each its share of the default budget; the first estimates the latency and measures peak memory, the later ones are
given both), plain (the verified inputs, nothing observed) and checked (round.TimedRound: fresh content on every
call, input snapshots, the last call and each other drawn copied, and judging against the reference), interleaved so
the machine's load falls on both alike.

    python benchmarks/integrity_overhead.py [--matrix default] [--backends naive sdpa] [--repeats 5] [--cases 30]

The later rounds of both ways are given the same latency estimate (a calibration round's): a round's repetitions
are its budget over the estimate, and the first round's estimate alone moved a fast key's round by +-40 % between
two plain runs - noise that is not the checks'. Reports per key the wall and CPU time of its rounds both ways
(median over repeats), and the total over the slice; the median latency figure itself is also compared (the
checks run outside the timed region: it should not move).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from harness.backends.registry import get_backends
from harness.run.benchmark import phase_verdict
from harness.run.judge import judge_timed
from harness.calls.call import Call
from harness.run.runner import execute, prepare_case
from harness.isolation.in_process import InProcessExecutor
from harness.isolation.supervisor import IsolatedExecutor
from harness.calls.timed import TimingCall
from harness.measure.timing import TimingConfig
from harness.cases.matrices import build_matrix
from harness.store.schema import PASS, PHASES


def key_timing(executor, backend, prepared, phase, rounds: int, estimate_ms: float, checked: bool, verdict
               ) -> tuple[float, float, float]:
    """(wall s, CPU s of this process, median latency ms of the last round) of timing one key in `rounds` rounds
    through `executor` (the one that judged `verdict`, which kept its answers); the rounds after the first are
    given `estimate_ms` and the first round's memory; the key's verdict is handed to judge_timed as a suite run
    hands it."""
    case, memory, wall, cpu, latency = prepared.case, None, 0.0, 0.0, float("nan")
    for index in range(rounds):
        timing = TimingCall(Call(case, prepared.seed, prepared.inputs), phase, TimingConfig().share(rounds, index),
                            estimate_ms=None if index == 0 else estimate_ms, known_memory=memory, checked=checked)
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        result = executor.time(backend, timing, prepared.device)
        if result.failure is not None:
            raise RuntimeError(result.failure.reason)
        if checked:
            problem = (judge_timed(backend.name, prepared, phase, result.observed, timing.seed, result.witness)
                       or result.integrity)
            assert not problem, problem
        wall += time.perf_counter() - start_wall
        cpu += time.process_time() - start_cpu
        memory, latency = (result.peak_mem_bytes, result.mem_method), result.measurement.median
    return wall, cpu, latency


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="default")
    parser.add_argument("--backends", nargs="+", default=["naive", "sdpa"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3, help="rounds a key, as --rounds of a suite run")
    parser.add_argument("--isolate", action="store_true",
                        help="in workers, as the main job times (the run's brackets of each call included)")
    parser.add_argument("--control", action="store_true",
                        help="both sides plain (an A/A run): the spread the method itself gives a key's figure")
    args = parser.parse_args()
    device = torch.device("cpu")
    executor = IsolatedExecutor(device) if args.isolate else InProcessExecutor()
    totals = {False: 0.0, True: 0.0}
    print(f"{'key':72s} {'plain s':>8s} {'checked':>8s} {'+% wall':>7s} {'+% cpu':>7s} {'lat plain':>10s} "
          f"{'lat chk':>9s}")
    for case in build_matrix(args.matrix)[:args.cases]:
        prepared = prepare_case(case, device, 12345)
        for backend in get_backends(args.backends):
            if backend.can_run(case, device) or backend.unavailable_reason(device):
                continue
            verdict = execute(backend, prepared, executor=executor).released()
            for phase in PHASES:
                if phase_verdict(verdict, phase)[0] != PASS:  # a suite run does not time it either
                    continue
                name = f"{case.id} {backend.name} {phase}"
                runs = {False: [], True: []}
                try:
                    # calibration, warm-up
                    _, _, estimate = key_timing(executor, backend, prepared, phase, 1, 0.0, False, verdict)
                    for _ in range(args.repeats):
                        for checked in (False, True):
                            runs[checked].append(key_timing(executor, backend, prepared, phase, args.rounds,
                                                            estimate, checked and not args.control, verdict))
                except Exception as exc:  # noqa: BLE001 - a key this script cannot time is listed, the rest go on
                    print(f"{name:72s} not measured: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                wall, cpu, lat = ({c: statistics.median(r[i] for r in runs[c]) for c in runs} for i in range(3))
                totals[False] += wall[False]
                totals[True] += wall[True]
                print(f"{name:72s} {wall[False]:8.4f} {wall[True]:8.4f} {100 * (wall[True] / wall[False] - 1):7.1f} "
                      f"{100 * (cpu[True] / cpu[False] - 1):7.1f} {lat[False]:10.4g} {lat[True]:9.4g}", flush=True)
    print(f"total wall: plain {totals[False]:.2f} s, checked {totals[True]:.2f} s "
          f"(+{100 * (totals[True] / totals[False] - 1):.1f}%); {torch.get_num_threads()} threads, "
          f"load average {open('/proc/loadavg').read().split()[0]}")


if __name__ == "__main__":
    main()
