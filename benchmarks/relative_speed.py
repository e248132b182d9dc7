"""Each backend's call rate as a multiple of the same-dtype GEMM rate the cost model measures: what a backend's
`relative_speed` declares (harness/planning/cost.py; docs/measurements.md, "The whole job's estimate").

    python benchmarks/relative_speed.py [--backends naive,sdpa,sdpa-math,sdpa-flash,flex] [--device cpu]

One causal case (b1 h8 s1024 d64) in bf16 and fp32; a call's time is the best of 3 after one untimed call (compile,
lazy init), forward without autograd and forward+backward; its FLOPs are the reference's dense count.
"""

from __future__ import annotations

import argparse
import time

import torch

from harness.backends.registry import get_backends
from harness.calls.bound import BoundCall, backend_inputs
from harness.planning.rates import baseline_rate
from harness.oracle.reference import reference_flops
from harness.cases.case import AttentionCase, make_inputs
from harness.cases.masks import Causal


def best_seconds(backend, case, inputs, device: torch.device, grads: bool, calls: int = 4) -> float:
    """The fewest seconds of `calls` - 1 calls after the first (compile and lazy initialisation are not a call's)."""
    call, best = BoundCall(backend, case, device), float("inf")
    for i in range(calls):
        q, k, v, d_out = backend_inputs(backend, case, inputs, requires_grad=grads)
        start = time.perf_counter()
        if grads:
            call(q, k, v).backward(d_out)
        else:
            with torch.no_grad():
                call(q, k, v)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="naive,sdpa,sdpa-math,sdpa-flash,flex")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    for dtype in ("bf16", "fp32"):
        case = AttentionCase(1, 8, 1024, 64, dtype, mask=Causal())
        inputs, rate = make_inputs(case, device, 0), baseline_rate(device, case.dtype)
        for backend in get_backends(args.backends):
            for grads in (False, True):
                if grads and backend.backward_reasons(device):
                    continue
                seconds = best_seconds(backend, case, inputs, device, grads)
                speed = reference_flops(case, grads=grads) / seconds / rate
                print(f"{dtype} {backend.name:<14} {'fwd+bwd' if grads else 'fwd':<7} {seconds * 1e3:8.1f} ms  "
                      f"relative speed {speed:.3f} (GEMM {rate / 1e9:.0f} GFLOP/s; declared "
                      f"{backend.relative_speed.get(device.type, 1.0)})", flush=True)


if __name__ == "__main__":
    main()
