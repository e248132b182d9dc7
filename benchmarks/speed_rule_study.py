"""Does the speed rule (docs/integrity.md: a call on new inputs over 3x the calls on inputs just seen, confirmed in
pairs) reject honest keys on a loaded machine? Rounds of real keys timed as a suite run times them, with `--busy`
bursty CPU-bound processes (gate_study's) running beside, counting the rounds whose last call triggered the
confirmation and the rounds rejected.

    python benchmarks/speed_rule_study.py [--rounds 20] [--busy 2] [--keys CASE:BACKEND:PHASE ...]

Every key here is honest (naive, sdpa-math): any rejection is a false one.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gate_study import Busy  # noqa: E402

from harness.backends.registry import get_backends  # noqa: E402
from harness.execution.call import Call  # noqa: E402
from harness.execution.integrity import round_inputs, round_options, seen_violation  # noqa: E402
from harness.execution.runner import prepare_case  # noqa: E402
from harness.execution.timed import TimingCall, run_timing  # noqa: E402
from harness.measure.timing import TimingConfig  # noqa: E402
from harness.spec.matrices import build_matrix  # noqa: E402

#: the three keys a default run on a loaded VM rejected with the old pair order (2026-12-02), and two fp32 ones
KEYS = ["bf16-b2-h4-s129-d59-causal:sdpa-math:bwd", "bf16-b2-h4-s129-d256-causal:naive:fwd",
        "bf16-b3-h8kv2-s4x199-d64-cache-causal199_167_133-page16-fp8kv-head:sdpa-math:fwd",
        "fp32-b2-h4-s113x203-d64-causal:naive:fwd+bwd", "fp32-b2-h4-s113x203-d64-window50-0:sdpa-math:bwd"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--busy", type=int, default=2)
    parser.add_argument("--keys", nargs="+", default=KEYS)
    args = parser.parse_args()
    cases = {c.id: c for c in build_matrix("default")}
    device, config = torch.device("cpu"), TimingConfig.for_budget(100.0 / 3)
    total = {"rounds": 0, "triggered": 0, "rejected": 0}
    start = time.monotonic()
    with Busy(args.busy, limit_s=3600):
        for key in args.keys:
            case_id, name, phase = key.split(":")
            case = cases[case_id]
            (backend,) = get_backends([name])
            prepared = prepare_case(case, device, 11)
            triggered = rejected = 0
            for r in range(args.rounds):
                plan = round_inputs(11 + r, (case.id, name, phase), r, **round_options(case, phase))
                result = run_timing(backend, TimingCall(Call(case, 11 + r), phase, config, inputs=plan), device)
                samples = result.measurement.samples_ms
                triggered += bool(seen_violation(samples[:-1], samples[-1:]))
                rejected += "faster on inputs it has seen" in result.integrity
            print(f"{key}: {args.rounds} rounds, confirmation triggered in {triggered}, rejected {rejected}",
                  flush=True)
            total["rounds"] += args.rounds
            total["triggered"] += triggered
            total["rejected"] += rejected
            del prepared
    print(f"total: {total}; {time.monotonic() - start:.0f} s; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs with {args.busy} busy processes")


if __name__ == "__main__":
    main()
