"""Is a slow CPU call's first repetition, after other heavy keys ran or after its profiled first call, slower than
its next ones? (SELF_WARMING_MS, and the estimate call counted as a sample)

    python benchmarks/slow_call_warmup_study.py [--rounds 6]

A later timing round of a key gets no warm-up call when the call takes at least SELF_WARMING_MS
(harness/measure/timing.py). Here two slow keys of the CPU default matrix (naive bf16 s1023 fwd, naive fp32 s2048
fwd) are timed in rounds, with another heavy key (sdpa-math fp32 s2048 fwd+bwd) run twice between them, as the
suite interleaves keys; per round, the first call over the median of the next three. Ratios near 1 (within the
calls' own noise): the first call needs no warm-up call before it.

Second part: a round 1 as the harness runs it on the CPU - fresh inputs, the first call under the memory profiler
(cpu_peak), then the estimate call - and the estimate call over the median of the next three. Ratios near 1: the
estimate call of a slow key is a sample like the next ones (harness/measure/timing.py counts it as the first).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from harness.backends.registry import get_backends
from harness.calls.call import Call, call_inputs
from harness.calls.round import TimedRound
from harness.measure.memory import cpu_peak
from harness.cases.case import AttentionCase

CPU = torch.device("cpu")


def timed_key(backend: str, case: AttentionCase, phase: str, seed: int = 0):
    """One call of the key, timed as the harness times it (setup outside the clock), in ms; once(profiled=True)
    runs it under the memory profiler, as a CPU round's first call is."""
    (impl,) = get_backends([backend])
    timed = TimedRound(impl, case, phase, CPU, call_inputs(Call(case, seed), CPU, None))
    timed.build()

    def once(profiled: bool = False) -> float:
        timed.setup()
        start = time.perf_counter_ns()
        cpu_peak(timed.call) if profiled else timed.call()
        return (time.perf_counter_ns() - start) / 1e6
    return once


def report(ratios: dict[str, list[float]], what: str) -> None:
    for name, values in ratios.items():
        print(f"{name}: {what}: {' '.join(f'{r:.3f}' for r in values)}; median {statistics.median(values):.3f}")


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
    report(ratios, "first / median of the next 3")
    shapes = {"naive bf16 s1023 fwd": ("naive", AttentionCase(2, 4, 1023, 64, "bf16"), "fwd"),
              "naive bf16 s1023 bwd": ("naive", AttentionCase(2, 4, 1023, 64, "bf16"), "bwd"),
              "sdpa-math fp32 s2048 fwd+bwd": ("sdpa-math", AttentionCase(2, 4, 2048, 64, "fp32"), "fwd+bwd")}
    after_probe: dict[str, list[float]] = {name: [] for name in shapes}
    for seed in range(1, args.rounds + 1):
        for name, key in shapes.items():
            once = timed_key(*key, seed=seed)  # a round's fresh inputs, as each round draws them
            once(profiled=True)
            estimate = once()
            after_probe[name].append(estimate / statistics.median([once() for _ in range(3)]))
    report(after_probe, "the estimate call (after the profiled first call) / median of the next 3")


if __name__ == "__main__":
    main()
