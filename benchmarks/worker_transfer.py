"""What does moving a timing round's answers from a worker process to the run cost, inline in the message or
through the reply end's shared-memory arena (harness.isolation.wire.Channel), by tensor size?

    python benchmarks/worker_transfer.py [--sizes-kib 4,8,16,32,64,256,1024,8192] [--answers 5] [--repeats 15]

A worker returns `answers` dicts of four tensors (out, dq, dk, dv) of each size, as a checked fwd+bwd round's judged
calls do; the "worker pipe" stage (harness.measure.stages: the round trip less the worker's own time) is the
transfer. Medians, alternating the two ways, the worker on one thread. The crossover sets wire.INLINE_BYTES.
"""

from __future__ import annotations

import argparse
import statistics

import torch

import harness.isolation.wire as wire
from harness.backends.registry import get_backends
from harness.isolation.executor import make_executor
from harness.measure import stages


def results(backend, device, numel: int, answers: int, inline_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Runs in the worker: `answers` x four fp32 tensors, sent back inline up to `inline_bytes` each."""
    wire.INLINE_BYTES = inline_bytes
    return [{q: torch.zeros(numel) for q in ("out", "dq", "dk", "dv")} for _ in range(answers)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-kib", default="4,8,16,32,64,256,1024,8192")
    parser.add_argument("--answers", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    cpu = torch.device("cpu")
    executor = make_executor(cpu, isolate=True, modules=(), threads=1)
    naive = get_backends(["naive"])[0]
    try:
        executor.unavailable_reason(naive, cpu)  # starts the worker
        for kib in (int(s) for s in args.sizes_kib.split(",")):
            pipe: dict[str, list[float]] = {"inline": [], "arena": []}
            for _ in range(args.repeats):
                for way, inline_bytes in (("inline", 2 ** 62), ("arena", 0)):
                    stages.STAGE_CLOCK.reset()
                    executor.run(naive, results, cpu, kib * 2 ** 10 // 4, args.answers, inline_bytes)
                    pipe[way].append(stages.STAGE_CLOCK.snapshot()["worker pipe"][0])
            print(f"{args.answers} x 4 x {kib} KiB: inline {statistics.median(pipe['inline']) * 1e3:.2f} ms, "
                  f"arena {statistics.median(pipe['arena']) * 1e3:.2f} ms", flush=True)
    finally:
        executor.close()


if __name__ == "__main__":
    main()
