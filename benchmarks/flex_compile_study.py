"""What does compiling FlexAttention once per shape cost, against once with dynamic shapes? Cold cache, CPU.

    python benchmarks/flex_compile_study.py [--matrix default] [--repeats 20]

For each mode (static: torch.compile(flex_attention, dynamic=False); dynamic: dynamic=True) a fresh process with
an empty TORCHINDUCTOR_CACHE_DIR runs flex's forward on every case of the matrix it supports, as the correctness
stage does (the harness's own Flex backend, its BlockMask and score_mod), and records: the first call of each case
(compile included), then the median of `--repeats` steady calls (the kernel a timing round would measure). Prints
the total first-call seconds per mode and, per case, both latencies and their ratio: a dynamic kernel must not be
slower than the static one it replaces.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def flex_forwards(matrix: str):
    """(case, forward) for each case of the matrix flex supports on the CPU, as the correctness stage calls it: the
    harness's own Flex backend, its BlockMask and score_mod, seeded inputs."""
    import torch

    from harness.backends import flex
    from harness.calls.bound import backend_inputs, case_kwargs, modifier_leaves
    from harness.cases.case import make_inputs
    from harness.cases.matrices import build_matrix

    backend, device = flex.Flex(), torch.device("cpu")
    for case in build_matrix(matrix):
        if backend.can_run(case, device):
            continue
        inputs = make_inputs(case, device, 0)
        kwargs = case_kwargs(case, device, modifier_leaves(inputs, False))
        q, k, v, _ = backend_inputs(backend, case, inputs, False)
        plan = backend.prepare(case, device)
        yield case, lambda: backend.forward(q, k, v, mask=case.mask, scale=case.scale, prepared=plan, **kwargs)


def child(matrix: str, mode: str, repeats: int) -> None:
    from harness.backends import flex

    flex.DYNAMIC = mode == "dynamic"
    out = []
    for case, call in flex_forwards(matrix):
        start = time.perf_counter()
        try:
            call()
        except Exception as exc:  # an unsupported combination: recorded, not timed
            out.append({"case": case.id, "error": f"{type(exc).__name__}: {str(exc)[:100]}"})
            continue
        first = time.perf_counter() - start
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            samples.append(time.perf_counter() - start)
        out.append({"case": case.id, "first_s": first, "median_ms": statistics.median(samples) * 1e3})
    print(json.dumps(out))


def run(matrix: str, mode: str, repeats: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        proc = subprocess.run([sys.executable, __file__, "--child", mode, "--matrix", matrix, "--repeats",
                               str(repeats)], capture_output=True, text=True, env=env)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-3000:])
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default="default")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--child", choices=("static", "dynamic"))
    args = parser.parse_args()
    if args.child:
        return child(args.matrix, args.child, args.repeats)
    runs = {}
    for mode in ("static", "dynamic"):
        start = time.monotonic()
        runs[mode] = {r["case"]: r for r in run(args.matrix, mode, args.repeats)}
        print(f"{mode}: {time.monotonic() - start:.1f} s in all, first calls "
              f"{sum(r.get('first_s', 0) for r in runs[mode].values()):.1f} s", flush=True)
    print(f"{'case':58} {'static ms':>10} {'dynamic ms':>10} {'ratio':>6}")
    ratios = []
    for case, s in runs["static"].items():
        d = runs["dynamic"].get(case, {})
        if "median_ms" in s and "median_ms" in d:
            ratios.append(d["median_ms"] / s["median_ms"])
            print(f"{case:58} {s['median_ms']:10.3f} {d['median_ms']:10.3f} {ratios[-1]:6.2f}")
        else:
            print(f"{case:58} {s.get('error', '')} | {d.get('error', '')}")
    if ratios:
        print(f"dynamic/static latency: median {statistics.median(ratios):.2f}, max {max(ratios):.2f}")


if __name__ == "__main__":
    main()
