"""How far the run's clock and a worker's disagree on honest rounds (the clock audit's false rejections, docs/integrity.md):
keys timed in isolated workers as a suite run times them, each round's claimed samples, the worker's span and the
run's clock around the request, and the audit's verdict; with --backend-module, a plugin's backends (those of
tests/fixtures/clock_plugins.py slow the clock 5-fold).

    python benchmarks/clock_audit_study.py [--matrix smoke] [--backends naive sdpa] [--repeats 3] [--cases N]
        [--backend-module M]

Prints one line per round (the samples' sum, the round by the worker's clock and by the run's, the time the worker's
clock did not see) and a summary: the rounds rejected and the distribution of the unseen time, with the load average.
Each round is audited once here (a suite run times a disagreeing round once more before rejecting it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import torch

from harness.backends.registry import get_backends
from harness.run.benchmark import phase_verdict
from harness.calls.call import Call
from harness.run.audit import clock_audit
from harness.run.runner import execute, prepare_case
from harness.isolation.supervisor import IsolatedExecutor
from harness.calls.timed import TimingCall
from harness.measure.timing import TimingConfig
from harness.cases.matrices import build_matrix
from harness.store.schema import PASS, PHASES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="smoke")
    parser.add_argument("--backends", nargs="+", default=["naive", "sdpa"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", type=int, default=None, help="the matrix's first N cases only")
    parser.add_argument("--dump", default=None, help="a JSON file for each round's brackets, samples and audit")
    parser.add_argument("--backend-module", default=None,
                        help="a plugin module to load (tests/fixtures/clock_plugins.py plants clocks slowed 5x)")
    args = parser.parse_args()
    device = torch.device("cpu")
    if args.backend_module:
        from harness.backends.registry import load_backend_module

        load_backend_module(args.backend_module)  # the workers load what this process loaded
    executor = IsolatedExecutor(device, threads=torch.get_num_threads())
    excess, ratios, rejected, total, dumped = [], [], [], 0, []
    try:
        for case in build_matrix(args.matrix)[:args.cases]:
            prepared = prepare_case(case, device, 12345)
            for backend in get_backends(args.backends):
                if backend.can_run(case, device) or backend.unavailable_reason(device):
                    continue
                verdict = execute(backend, prepared, executor=executor)
                for phase in PHASES:
                    if phase_verdict(verdict, phase)[0] != PASS:
                        continue
                    for _ in range(args.repeats):
                        estimate, memory = None, None
                        for index in range(args.rounds):
                            timing = TimingCall(Call(case, prepared.seed, prepared.inputs), phase,
                                                TimingConfig().share(args.rounds, index), estimate_ms=estimate,
                                                known_memory=memory)
                            result = executor.time(backend, timing, device)
                            if result.failure is not None:
                                print(f"{case.id} {backend.name} {phase}: {result.failure.reason}")
                                break
                            claimed = sum(result.measurement.samples_ms)
                            unseen = result.wall_ms - result.accounted_ms
                            audit = clock_audit(result)
                            problem = "" if audit.loaded else audit.problem  # unauditable: no figure, not rejected
                            total += 1
                            excess.append(unseen)
                            ratios.append(result.wall_ms / result.accounted_ms)
                            if problem:
                                rejected.append(problem)
                            if audit.problem:
                                print(f"    {audit.problem}")
                            if args.dump and result.witness is not None:
                                dumped.append({"threads": result.witness.threads,
                                               "samples": list(result.measurement.samples_ms),
                                               "brackets": [dataclasses.astuple(b) for b in result.witness.brackets],
                                               "problem": audit.problem, "loaded": audit.loaded})
                            print(f"{case.id[:48]:48s} {backend.name:6s} {phase:7s} r{index + 1} claimed "
                                  f"{claimed:8.3f} accounted {result.accounted_ms:8.3f} run's clock {result.wall_ms:8.3f} "
                                  f"unseen {unseen:7.3f} {'REJECTED' if problem else 'UNAUDITABLE' if audit.loaded else ''}", flush=True)
                            estimate = estimate or result.measurement.median
                            memory = memory or (result.peak_mem_bytes, result.mem_method)
    finally:
        executor.close()
        if args.dump:
            Path(args.dump).write_text(json.dumps(dumped))
    q = statistics.quantiles(excess, n=100) if len(excess) > 2 else excess
    print(f"rounds {total}, rejected {len(rejected)}; unseen ms (the run's clock - the round's accounted time): median "
          f"{statistics.median(excess):.3f}, p90 {q[89]:.3f}, p99 {q[98]:.3f}, max {max(excess):.3f}; run's / accounted "
          f"median {statistics.median(ratios):.2f}, min {min(ratios):.2f}, max {max(ratios):.2f}; load average "
          f"{open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
