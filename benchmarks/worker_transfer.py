"""What does moving a call's results from a worker process to the run cost, inline in the message or through
shared memory, by tensor size?

    python benchmarks/worker_transfer.py [--sizes-mib 0.0625,0.25,1,2,4,8,64] [--repeats 7]

A worker returns four tensors (out, dq, dk, dv) of each size; the "worker pipe" stage (harness.measure.stages:
the round trip less the worker's own time) is the transfer. Medians, alternating the two ways. The crossover
sets harness.execution.wire.INLINE_BYTES.
"""

from __future__ import annotations

import argparse
import statistics

import torch

import harness.execution.wire as wire
from harness.backends.registry import get_backends
from harness.execution.call import CallResult
from harness.execution.executor import make_executor
from harness.measure import stages


def results(backend, device, numel: int, inline_bytes: int) -> CallResult:
    """Runs in the worker: four bf16 tensors, sent back inline up to `inline_bytes` each."""
    wire.INLINE_BYTES = inline_bytes
    out, dq, dk, dv = (torch.zeros(numel, dtype=torch.bfloat16) for _ in range(4))
    return CallResult(out=out, grads={"dq": dq, "dk": dk, "dv": dv})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", default="0.0625,0.25,1,2,4,8,64")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    cpu = torch.device("cpu")
    executor = make_executor(cpu, isolate=True, modules=())
    naive = get_backends(["naive"])[0]
    try:
        executor.unavailable_reason(naive, cpu)  # starts the worker
        for mib in (float(s) for s in args.sizes_mib.split(",")):
            pipe: dict[str, list[float]] = {"inline": [], "shared memory": []}
            for _ in range(args.repeats):
                for way, inline_bytes in (("inline", 2 ** 62), ("shared memory", 0)):
                    stages.CLOCK.reset()
                    executor.run(naive, results, cpu, int(mib * 2 ** 20) // 2, inline_bytes)
                    pipe[way].append(stages.CLOCK.snapshot()["worker pipe"][0])
            print(f"4 x {mib:g} MiB: inline {statistics.median(pipe['inline']) * 1e3:.1f} ms, "
                  f"shared memory {statistics.median(pipe['shared memory']) * 1e3:.1f} ms")
    finally:
        executor.close()


if __name__ == "__main__":
    main()
