"""What the timing integrity checks cost (docs/integrity.md): one round of a key timed plain (the verified inputs,
nothing observed) and checked (transformed inputs, input snapshots, the last two calls copied, the speed rule,
and judging in the parent against the reference), interleaved so the machine's load falls on both alike.

    python benchmarks/integrity_overhead.py [--matrix smoke] [--backends naive sdpa] [--repeats 3] [--cases 6]

Reports per key the CPU time of a round both ways (median over repeats) and the total over the slice; the
median latency figure itself is also compared (the checks run outside the timed region: it should not move).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from harness.backends.registry import get_backends
from harness.execution.benchmark import judge_timed
from harness.execution.call import Call
from harness.execution.integrity import round_inputs, round_options
from harness.execution.runner import prepare_case
from harness.execution.timed import TimingCall, run_timing
from harness.measure.timing import TimingConfig
from harness.spec.matrices import build_matrix
from harness.store.schema import PHASES


def one_round(backend, prepared, phase, config, checked: bool) -> tuple[float, float]:
    """(CPU seconds of this process over the round, median latency ms): CPU time, not wall time, so the other
    processes of a shared machine do not count (they still slow its caches)."""
    inputs = (round_inputs(prepared.seed, (prepared.case.id, backend.name, phase), 0, **round_options(prepared.case))
              if checked else None)
    start = time.process_time()
    result = run_timing(backend, TimingCall(Call(prepared.case, prepared.seed), phase, config, inputs=inputs),
                        prepared.device)
    if checked and result.failure is None:
        problem = judge_timed(backend, prepared, phase, result.observed) or result.integrity
        assert not problem, problem
    wall = time.process_time() - start
    return wall, (result.measurement.median if result.measurement else float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="smoke")
    parser.add_argument("--backends", nargs="+", default=["naive", "sdpa"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", type=int, default=6)
    parser.add_argument("--budget-ms", type=float, default=100.0 / 3, help="one round's share of the default budget")
    args = parser.parse_args()
    device = torch.device("cpu")
    config = TimingConfig.for_budget(args.budget_ms)
    totals = {False: 0.0, True: 0.0}
    print(f"{'key':70s} {'plain cpu s':>11s} {'checked':>8s} {'+%':>6s} {'lat plain':>10s} {'lat chk':>9s}")
    for case in build_matrix(args.matrix)[:args.cases]:
        prepared = prepare_case(case, device, 12345)
        for backend in get_backends(args.backends):
            if backend.can_run(case, device) or backend.unavailable_reason(device):
                continue
            for phase in PHASES:
                walls, lats = {False: [], True: []}, {False: [], True: []}
                try:
                    for _ in range(args.repeats):
                        for checked in (False, True):
                            wall, lat = one_round(backend, prepared, phase, config, checked)
                            walls[checked].append(wall)
                            lats[checked].append(lat)
                except Exception as exc:  # noqa: BLE001 - a key this script cannot time is listed, the rest go on
                    print(f"{case.id + ' ' + backend.name + ' ' + phase:70s} not measured: {type(exc).__name__}: "
                          f"{str(exc)[:120]}")
                    continue
                w = {c: statistics.median(v) for c, v in walls.items()}
                totals[False] += w[False]
                totals[True] += w[True]
                print(f"{case.id + ' ' + backend.name + ' ' + phase:70s} {w[False]:8.3f} {w[True]:9.3f} "
                      f"{100 * (w[True] / w[False] - 1):6.1f} {statistics.median(lats[False]):10.4g} "
                      f"{statistics.median(lats[True]):9.4g}")
    print(f"total: plain {totals[False]:.2f} s, checked {totals[True]:.2f} s "
          f"(+{100 * (totals[True] / totals[False] - 1):.1f}%); machine shared: {torch.get_num_threads()} threads, "
          f"load average {open('/proc/loadavg').read().split()[0]}")


if __name__ == "__main__":
    main()
