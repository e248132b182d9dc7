"""Is a slow CPU call's first repetition, after other heavy keys ran, slower than its next ones? (SELF_WARMING_MS)

    python benchmarks/slow_call_warmup_study.py [--rounds 6]

A later timing round of a key gets no warm-up call when the call takes at least SELF_WARMING_MS
(harness/measure/timing.py). Here two slow keys of the CPU default matrix (naive bf16 s1023 fwd, naive fp32 s2048
fwd) are timed in rounds, with another heavy key (sdpa-math fp32 s2048 fwd+bwd) run twice between them, as the
suite interleaves keys; per round, the first call over the median of the next three. Ratios near 1 (within the
calls' own noise): the first call needs no warm-up call before it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from harness.backends.registry import get_backends
from harness.execution.call import Call, call_inputs
from harness.execution.timed import phase_callables
from harness.spec.case import AttentionCase

CPU = torch.device("cpu")


def timed_key(backend: str, case: AttentionCase, phase: str):
    """One call of the key, timed as the harness times it (setup outside the clock), in ms."""
    (impl,) = get_backends([backend])
    phase_fn = phase_callables(impl, case, call_inputs(Call(case, 0), CPU, None), CPU, phase)
    if phase_fn.build is not None:
        phase_fn.build()

    def once() -> float:
        if phase_fn.setup is not None:
            phase_fn.setup()
        start = time.perf_counter_ns()
        phase_fn.fn()
        return (time.perf_counter_ns() - start) / 1e6
    return once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    keys = {"naive bf16 s1023 fwd": timed_key("naive", AttentionCase(2, 4, 1023, 64, "bf16"), "fwd"),
            "naive fp32 s2048 fwd": timed_key("naive", AttentionCase(2, 4, 2048, 64, "fp32"), "fwd")}
    between = timed_key("sdpa-math", AttentionCase(2, 4, 2048, 64, "fp32"), "fwd+bwd")
    for once in (*keys.values(), between):
        once(), once()  # first calls (lazy init) kept out
    ratios: dict[str, list[float]] = {name: [] for name in keys}
    for _ in range(args.rounds):
        for name, once in keys.items():
            between(), between()
            first = once()
            ratios[name].append(first / statistics.median([once() for _ in range(3)]))
    for name, values in ratios.items():
        print(f"{name}: first / median of the next 3: {' '.join(f'{r:.3f}' for r in values)}; "
              f"median {statistics.median(values):.3f}")


if __name__ == "__main__":
    main()
