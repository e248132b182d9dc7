"""Does the harness's timer agree with an independent one on this machine? N repetitions of the fidelity check.

    python benchmarks/fidelity_study.py [--runs 10] [--device cpu]

Each repetition is what `pytest suites --benchmark` records in its timing-fidelity row: sdpa's forward on one
case, timed by the harness and by torch.utils.benchmark.Timer (triton's do_bench on a GPU) in 30 interleaved
ABBA blocks; the figure is the median of the blocks' ratios with a block-bootstrap spread. Target (issue: regression gate):
|ratio - 1| <= 3 % in >= 9 of 10 runs. Each repetition is a fresh process, like a real run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

ONE = """
import json, torch
from harness import AttentionCase
from harness.backends.registry import get_backends
from harness.calls.device import resolve_device
from harness.probes.fidelity import fidelity_of
from harness.cases.masks import Causal
device = resolve_device({device!r})
case = (AttentionCase(2, 8, 4096, 128, "bf16", mask=Causal()) if device.type == "cuda"
        else AttentionCase(1, 8, 512, 64, "fp32", mask=Causal()))
result = fidelity_of(get_backends(["sdpa"])[0], device, case, 0)
print(json.dumps({{**result.columns(), "describe": result.describe()}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    results = []
    for i in range(args.runs):
        out = subprocess.run([sys.executable, "-c", ONE.format(device=args.device)], capture_output=True, text=True,
                             check=True).stdout.strip().splitlines()[-1]
        r = json.loads(out)
        results.append(r)
        print(f"run {i + 1}: {r['describe']}", flush=True)
    within = sum(abs(r["ratio"] - 1) <= 0.03 for r in results)
    noisy = sum(r["noisy"] for r in results)
    ratios = sorted(r["ratio"] for r in results)
    print(f"|ratio - 1| <= 3 % in {within}/{len(results)} runs (target >= 9/10); ratios {ratios[0]:.3f}..{ratios[-1]:.3f},"
          f" median {ratios[len(ratios) // 2]:.3f}; {noisy} run(s) said too noisy to tell")


if __name__ == "__main__":
    main()
