"""How fast is the float64 reference, against a float64 GEMM measured in the same process?

    python benchmarks/reference_throughput.py [--device cpu|cuda] [--seqs 1024,2048] [--head-dim 128]

Prints, per shape, the reference's forward+backward time, its GEMM work (reference_flops: six GEMMs of
2*B*H*Sq*Sk*D each) as GFLOP/s, and that rate over the GEMM's. The target on the CPU (issue: GPU-scale
workloads) is >= 60 % for S >= 1024, D = 128.
"""

from __future__ import annotations

import argparse
import time

import torch

from harness.oracle.reference import reference_attention, reference_flops
from harness.cases.case import AttentionCase, make_inputs
from harness.cases.masks import Causal


def gemm_seconds(a: torch.Tensor, b: torch.Tensor) -> float:
    start = time.perf_counter()
    a @ b
    if a.device.type == "cuda":
        torch.cuda.synchronize(a.device)
    return time.perf_counter() - start


def reference_seconds(case: AttentionCase, inputs) -> float:
    start = time.perf_counter()
    reference_attention(case, inputs)
    if inputs.q.device.type == "cuda":
        torch.cuda.synchronize(inputs.q.device)
    return time.perf_counter() - start


def peak_rates(case: AttentionCase, device: torch.device, rounds: int, n: int = 2048) -> tuple[float, float, float]:
    """(reference seconds, reference GFLOP/s, GEMM GFLOP/s): both the best over `rounds` interleaved rounds (a
    GEMM triple, then one reference), so a slow spell of a shared machine hits both sides alike and the ratio
    compares what each reaches at its best."""
    a = torch.randn(n, n, dtype=torch.float64, device=device)
    b = torch.randn(n, n, dtype=torch.float64, device=device)
    inputs = make_inputs(case, device)
    gemm_seconds(a, b), reference_seconds(case, inputs)  # warm-up
    best_gemm = best_ref = float("inf")
    for _ in range(rounds):
        best_gemm = min(best_gemm, *(gemm_seconds(a, b) for _ in range(3)))
        best_ref = min(best_ref, reference_seconds(case, inputs))
    return best_ref, reference_flops(case) / best_ref / 1e9, 2 * n ** 3 / best_gemm / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seqs", default="1024,2048")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}")
    for seq in (int(s) for s in args.seqs.split(",")):
        for mask in (None, Causal()):
            case = AttentionCase(1, args.heads, seq, args.head_dim, "fp32", mask=mask)
            seconds, rate, gemm = peak_rates(case, device, args.rounds)
            print(f"{case.id:<32} reference {seconds:7.2f} s  {rate:6.1f} GFLOP/s  float64 GEMM {gemm:6.1f} GFLOP/s"
                  f"  ratio {rate / gemm:5.1%}")


if __name__ == "__main__":
    main()
