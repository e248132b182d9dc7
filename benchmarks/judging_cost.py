"""What judging a matrix costs the host: one comparison against the float64 reference, chunked (oracle.verdict.
compare) and as whole-tensor ops (the formula it replaced), and the total for a matrix's correctness stage.

    python benchmarks/judging_cost.py [--matrix gpu-smoke] [--backends 7] [--repeats 5]

Every backend's output and gradients are judged on the CPU (the reference is kept there), so on a GPU run this
is host time per (case, backend): 4 comparisons (out, dq, dk, dv), plus 4 for the naive baseline per case.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from harness.oracle.verdict import compare
from harness.cases.matrices import MATRICES, build_matrix


def whole_tensor(actual: torch.Tensor, ref: torch.Tensor) -> tuple[float, bool, float]:
    actual = actual.to(torch.float64)
    bad = ~torch.isfinite(actual) & torch.isfinite(ref)
    diff = (actual - ref).abs().masked_fill(bad, 0.0)
    return float(diff.max()), bool(bad.any()), float(ref.abs().max())


def seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrix", default="gpu-smoke", choices=MATRICES)
    parser.add_argument("--backends", type=int, default=7, help="backends judged per case (besides the baseline)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cases = build_matrix(args.matrix)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; matrix {args.matrix}: {len(cases)} cases")
    totals = {"chunked": 0.0, "whole-tensor": 0.0}
    measured: dict = {}
    for case in cases:
        shapes = {(case.batch, case.heads, case.seq_q, case.head_dim),  # out, dq
                  (case.batch, case.kv_heads, case.seq_k, case.head_dim)}  # dk, dv
        for shape in shapes:
            key = (shape, case.dtype)
            if key not in measured:
                ref = torch.randn(shape, dtype=torch.float64)
                actual = ref.to(case.dtype)
                measured[key] = (seconds(lambda: compare(actual, ref), args.repeats),
                                 seconds(lambda: whole_tensor(actual, ref), args.repeats))
                print(f"  {str(case.dtype).removeprefix('torch.')} {shape}: chunked {measured[key][0] * 1e3:.1f} ms, "
                      f"whole-tensor {measured[key][1] * 1e3:.1f} ms")
        out, kv = (measured[((case.batch, case.heads, case.seq_q, case.head_dim), case.dtype)],
                   measured[((case.batch, case.kv_heads, case.seq_k, case.head_dim), case.dtype)])
        judged = args.backends + 1  # and the naive baseline
        for i, name in enumerate(totals):
            totals[name] += judged * (2 * out[i] + 2 * kv[i])
    print(f"judging the {args.matrix} correctness stage ({args.backends} backends + the baseline, fwd and bwd): "
          f"chunked {totals['chunked']:.1f} s, whole-tensor {totals['whole-tensor']:.1f} s")


if __name__ == "__main__":
    main()
