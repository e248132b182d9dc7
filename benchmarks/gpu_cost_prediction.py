"""Issue 63 without a GPU: what judging on the device and answers crossing by CUDA IPC remove from a GPU run, priced
with figures measured on this CPU where they can be (the host's share of the old path) and stated assumptions where
only a GPU can measure them; then the whole-job model's prediction for gpu-smoke at the unit costs before and after.

    PYTHONPATH=. python benchmarks/gpu_cost_prediction.py [--backends 9] [--d2h-gbps 10]

Measured here, one thread (the run judges on one): the host comparison against the float64 reference (elements/s),
the answers' checksums as the run recomputes them (elements/s), and a message's crossing through the shared-memory
arena (bytes/s, both copies). Assumed (a GPU measures them; scripts/refit_rates.py refits from its stage clocks):
the device-to-host copy (--d2h-gbps, pageable memory) and the device's comparison rate (HBM bandwidth over the bytes
compare() moves per element).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from dataclasses import replace

import torch

from harness.calls.round import JUDGED_DRAWS, checksum
from harness.cases.case import answer_elements
from harness.cases.matrices import build_matrix
from harness.isolation.wire import Channel
from harness.oracle.verdict import compare
from harness.backends.registry import get_backends
from harness.planning.cost import PHASES, Job, job_cost
from harness.planning.fitted import H200_BACKENDS, fitted_matrix
from harness.planning.rates import H200 as NOW
from harness.store.schema import BWD, FWD, FWD_BWD

#: bytes compare() moves per element on a device (bf16 answer): the float64 copy (10), sub (24), abs (16), the
#: finiteness masks (15), masked_fill (17), max and aminmax (16)
COMPARE_BYTES = 98
#: an H200's HBM bandwidth (bytes/s), and the share of it elementwise kernels of this size reach
HBM, HBM_SHARE = 4.8e12, 0.5
#: the H200 fit's two costs this changes (2026-11-30, verdicts on the host): the rest of its unit costs stand
HOST_FIT = {"call_s": 0.5, "judged_per_s": 6.6e7}
#: opening one IPC handle the first time (torch caches an allocation's: a worker's allocator reuses its segments)
IPC_OPEN_S = 1e-4


def best(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measured_rates(n: int = 1 << 24) -> dict[str, float]:
    torch.set_num_threads(1)
    ref = torch.randn(n, dtype=torch.float64)
    answer = ref.to(torch.bfloat16)
    rates = {"host compare (el/s)": n / best(lambda: compare(answer, ref)),
             "host checksum (el/s)": n / best(lambda: checksum(answer))}
    sender, receiver = multiprocessing.Pipe()
    out, into = Channel(sender, from_backend=False), Channel(receiver, from_backend=True)
    payload = {"out": answer}
    rates["arena crossing (B/s)"] = answer.nbytes / best(lambda: (out.send(payload), into.recv()))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", type=int, default=9, help="backends checked and timed per case")
    parser.add_argument("--d2h-gbps", type=float, default=10.0, help="assumed device-to-host copy rate (GB/s)")
    args = parser.parse_args()
    host_fit = replace(NOW, **HOST_FIT, extrapolated="")
    rates = measured_rates()
    for name, value in rates.items():
        print(f"measured here: {name} {value:.3g}")
    d2h, device_rate = args.d2h_gbps * 1e9, HBM * HBM_SHARE / COMPARE_BYTES
    print(f"assumed: device-to-host {d2h / 1e9:g} GB/s; device comparison {device_rate:.3g} el/s "
          f"(HBM {HBM / 1e12:g} TB/s x {HBM_SHARE:g} / {COMPARE_BYTES} B); IPC open {IPC_OPEN_S * 1e3:g} ms")
    cases = [c for c in build_matrix("gpu-smoke") if c.page_size is None]  # a paged case's answers: its queries'
    per_call, per_round, per_case = [], [], []
    for case in cases:
        itemsize = case.dtype.itemsize
        both = answer_elements(case, FWD_BWD) + answer_elements(case, FWD)  # the no-grad call's out judged too
        moved = both * itemsize
        # a correctness call: the answers' host copy, the arena, judged on the host (the H200 fit's host rate)
        transfer = moved / d2h + moved / rates["arena crossing (B/s)"]
        host_call = transfer + both / host_fit.judged_per_s
        device_call = 4 * IPC_OPEN_S + both / device_rate
        per_call.append((host_call, device_call, transfer))
        # the case's float64 reference brought to the host once (8 bytes an element, out and the gradients)
        per_case.append(answer_elements(case, FWD_BWD) * 8 / d2h)
        for phase in (FWD, BWD):
            answers = (JUDGED_DRAWS + 1) * answer_elements(case, phase)
            slices = answers / (case.batch * case.kv_heads)
            host_round = (answers * itemsize * (1 / d2h + 1 / rates["arena crossing (B/s)"])
                          + answers / rates["host checksum (el/s)"] + slices / host_fit.judged_per_s)
            device_round = (JUDGED_DRAWS + 1) * 3 * IPC_OPEN_S + answers / (device_rate * 20) + slices / device_rate
            per_round.append((host_round, device_round))
    transfer_removed = statistics.mean(t for _, _, t in per_call) + statistics.mean(per_case) / args.backends
    round_removed = statistics.mean(h - d for h, d in per_round)
    print(f"gpu-smoke ({len(cases)} unpaged cases): a correctness call's transfer and judging: host "
          f"{statistics.mean(h for h, _, _ in per_call):.3f} s, device {statistics.mean(d for _, d, _ in per_call):.4f} s "
          f"(the reference's copy to the host {statistics.mean(per_case):.3f} s a case)")
    print(f"a timed round's answers (the last and {JUDGED_DRAWS} drawn): host "
          f"{statistics.mean(h for h, _ in per_round):.3f} s, device {statistics.mean(d for _, d in per_round):.4f} s "
          f"(median host {statistics.median(h for h, _ in per_round):.3f} s)")
    after = replace(host_fit, call_s=round(max(0.05, host_fit.call_s - transfer_removed), 2), judged_per_s=float(f"{device_rate:.2g}"))
    print(f"removed: from call_s the answers' transfer {transfer_removed:.3f} s (the H200 fit's {host_fit.call_s} s -> "
          f"{after.call_s}); judging {host_fit.judged_per_s:.3g} -> {after.judged_per_s:.3g} el/s; from a key's round "
          f"{round_removed:.3f} s of host transfer and checks (not in the fit's key_round_s {host_fit.key_round_s} s, whose "
          "answers were checked in the worker then: kept)")
    backends = tuple(get_backends(list(H200_BACKENDS)))
    matrix = fitted_matrix(build_matrix("gpu-smoke"), torch.device("cuda"), as_h200=True)
    for name, unit in (("the H200 fit", host_fit), ("after (extrapolated)", after)):
        cost = job_cost(matrix, Job(backends, PHASES, 1, probes=True), unit)
        by = {stage: sum(s.seconds for s in cost.steps if s.stage == stage) for stage in ("correctness", "timing")}
        keys = sum(1 for s in cost.steps if s.stage == "timing")
        checked = sum(1 for s in cost.steps if s.stage == "correctness")
        per_key = [s.seconds for s in cost.steps if s.stage == "timing"]
        print(f"model, gpu-smoke, {len(backends)} backends, one round, {name}: {cost.seconds / 60:.1f} min; "
              f"correctness {by['correctness'] / checked:.2f} s a case and backend; a key "
              f"{statistics.median(per_key) / 0.125:.1f}x its 125 ms budget at the median ({keys} keys, "
              f"timing {by['timing'] / 60:.1f} min)")

if __name__ == "__main__":
    main()
