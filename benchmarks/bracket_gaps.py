"""How the run's bracket of each timed call (isolation/brackets.py) compares with the worker's reading of it on honest
rounds: the CPU time the worker took over the bracket, shared over its threads, less the reading - what
audit.CPU_SLACK_MS and CPU_SHARE stand on - and the wall time the reading leaves unaccounted for.

    PYTHONPATH=. python benchmarks/bracket_gaps.py [--rounds 3] [--backends naive,sdpa] [--matrix smoke] [--threads 1]

Prints a line a round (median sample, CPU bound - sample, wall gap; ms), then the quantiles over all rounds and the
rounds the audit's limit rejects."""

from __future__ import annotations

import argparse
import statistics

from harness.backends.registry import get_backends
from harness.calls.call import Call
from harness.calls.device import resolve_device
from harness.calls.timed import TimingCall
from harness.cases.matrices import build_matrix
from harness.isolation.supervisor import IsolatedExecutor
from harness.measure.timing import TimingConfig
from harness.run.audit import CPU_SHARE, CPU_SLACK_MS, bracket_audit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="naive,sdpa")
    parser.add_argument("--matrix", default="smoke")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    cpu = resolve_device("cpu")
    config = TimingConfig().share(args.rounds)
    executor = IsolatedExecutor(cpu, threads=args.threads)
    rows = []
    try:
        for case in build_matrix(args.matrix):
            for backend in get_backends(args.backends.split(",")):
                if backend.can_run(case, cpu):
                    continue
                for phase in ("fwd", "fwd+bwd"):
                    for _ in range(args.rounds):
                        answer = executor.time(backend, TimingCall(Call(case, 7), phase, config), cpu)
                        if answer.failure is not None or answer.witness is None:
                            continue
                        samples, brackets = answer.measurement.samples_ms, list(answer.witness.brackets)
                        timed = brackets[-len(samples):]
                        over = statistics.median(b.cpu_ns / args.threads - (b.end_ns - b.start_ns) for b in timed)
                        gap = statistics.median((b.closed_ns - b.opened_ns) - (b.end_ns - b.start_ns) for b in timed)
                        problem = bracket_audit(brackets, samples, args.threads)
                        rows.append((statistics.median(samples), over / 1e6, gap / 1e6, bool(problem)))
                        print(f"{backend.name:6} {phase:7} {case.id[:48]:48} sample {rows[-1][0]:8.4f} cpu over "
                              f"{rows[-1][1]:8.4f} wall gap {rows[-1][2]:7.4f}{'  REJECTED' if problem else ''}",
                              flush=True)
    finally:
        executor.close()
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
    over = [r[1] for r in rows]
    share = [r[1] / r[0] for r in rows if r[0] > 0]
    gaps = [r[2] for r in rows]
    print(f"{len(rows)} rounds; CPU bound - sample (ms): median {q(over, .5):.4f}, p90 {q(over, .9):.4f}, max "
          f"{max(over):.4f}; as a share of the sample: median {q(share, .5):.3f}, p90 {q(share, .9):.3f}, max "
          f"{max(share):.3f}; wall gap (ms): median {q(gaps, .5):.4f}, p90 {q(gaps, .9):.4f}, max {max(gaps):.4f}; "
          f"rejected by the limit ({CPU_SLACK_MS:g} ms + {CPU_SHARE:g} x the sample): {sum(r[3] for r in rows)}")


if __name__ == "__main__":
    main()
