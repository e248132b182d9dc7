"""The rates a job is priced at: FLOP rates measured on the device at hand (the float64 reference's, the baseline's
GEMM per dtype), and the unit costs of its fixed steps, fitted per device type and priced by the machine's load."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch

from harness.oracle.reference import reference_attention, reference_flops
from harness.cases.case import AttentionCase, make_inputs

#: the calibration case: big enough that its GEMMs run at the rate a real case sees, small enough to cost
#: ~0.1 s (CPU: 3 GFLOP) or ~10 ms (GPU: 0.4 TFLOP)
CALIBRATION = {"cpu": AttentionCase(1, 8, 512, 128, "fp32"), "cuda": AttentionCase(1, 16, 4096, 128, "fp32")}

#: the baseline's calibration GEMM on each device: (batch, n, d) of a (b, n, d) @ (b, d, n) matmul
BASELINE_GEMM = {"cpu": (4, 256, 128), "cuda": (16, 2048, 128)}
#: a rate is the best of this many samples after an untimed warm-up (thread pool start, kernel selection, page
#: faults). The best, not the median: load only slows a sample down, and the median of five moved 25x between three
#: commands on a loaded 2-core VM (issues 23, 35; docs/design/execution.md)
REPEATS = {"baseline": 7, "reference": 3}
#: a baseline sample repeats the GEMM until it has run this long, so a fast machine's timer resolution and
#: scheduling jitter do not decide its rate
MIN_SAMPLE_S = 0.02


def _best_seconds(call, device: torch.device, repeats: int, min_sample_s: float = 0.0) -> float:
    """Fewest seconds per `call()` over `repeats` samples (each at least `min_sample_s`) after a warm-up call."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    call()
    sync()
    samples = []
    for _ in range(repeats):
        calls, start, elapsed = 0, time.perf_counter(), -1.0
        while elapsed < min_sample_s:
            call()
            calls += 1
            sync()
            elapsed = time.perf_counter() - start
        samples.append(elapsed / calls)
    return min(samples)


@contextlib.contextmanager
def _per_thread(device: torch.device):
    """On a CPU, time on one thread and yield the thread count to scale by (1 on a GPU; docs/design/execution.md)."""
    if device.type == "cuda":
        yield 1
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield threads
    finally:
        torch.set_num_threads(threads)


@functools.lru_cache(maxsize=None)
def baseline_rate(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of a batched GEMM in `dtype` on `device` (the baseline's operation; ~1 GFLOP/s without bf16 units)."""
    b, n, d = BASELINE_GEMM["cuda" if device.type == "cuda" else "cpu"]
    x = torch.randn(b, n, d, device=device).to(dtype)
    y = torch.randn(b, d, n, device=device).to(dtype)
    with _per_thread(device) as threads:
        seconds = _best_seconds(lambda: torch.bmm(x, y), device, REPEATS["baseline"], MIN_SAMPLE_S)
    return 2 * b * n * n * d / seconds * threads


@functools.lru_cache(maxsize=None)
def reference_rate(device: torch.device) -> float:
    """The float64 reference's FLOP/s on `device`, on the calibration case (a call is long enough to need no loop)."""
    case = CALIBRATION["cuda" if device.type == "cuda" else "cpu"]
    inputs = make_inputs(case, device)
    with _per_thread(device) as threads:
        seconds = _best_seconds(lambda: reference_attention(case, inputs), device, REPEATS["reference"])
    return reference_flops(case) / seconds * threads


@dataclass(frozen=True)
class RunRates:
    """A job's unit costs on one device type, beside the FLOP rates measured at run time (docs/measurements.md,
    "The whole job's estimate"): what a step costs besides its arithmetic."""

    device_type: str
    #: the command's start before its first step: imports, the rates measured, the backends' availability asked
    startup_s: float
    #: a run session's start (the suites and `check`): its workers, the environment record, the peak probes
    session_s: float
    #: a case's own cost besides its reference's and baseline's arithmetic: its inputs, copies to the workers,
    #: recommend's bandwidth ceiling
    case_s: float
    #: a correctness call's fixed cost: the worker round trip, the inputs made again there, the answers sent back
    call_s: float
    #: the least one call of a backend takes, whatever its arithmetic (dispatch, a kernel launch)
    call_floor_s: float
    #: elements of an answer (out, dq, dk, dv) judged against the float64 reference per second
    judged_per_s: float
    #: a timing round's fixed cost besides its calls' arithmetic: round trip, memory probe, new content, the row
    key_round_s: float
    #: what a `compiles_per_shape` backend's compile of one new graph (a shape, with or without gradients) costs
    compile_s: float
    #: the probes stage per backend (its fixed small cases), and the graphs a compiling backend compiles there
    probes_s: float
    probe_graphs: int
    #: recommend's deployment checks per backend besides the determinism check's two calls (a small-shape compile)
    checks_s: float
    #: the benchmark stage's own tests: the timing fidelity and the reference's long-sequence memory
    fidelity_s: float
    #: the load average per CPU these costs are for (None: the device's own fit, load not read)
    load_per_cpu: float | None = None
    #: where these costs were fitted (the runs, their date, what they covered)
    fitted: str = ""
    #: '' when every cost was measured; else what is extrapolated, which an estimate at these costs says
    extrapolated: str = ""


#: where each device type's unit costs are kept: written by scripts/refit_rates.py from runs' stage clocks, never
#: copied by hand ("fitted": from what; "extrapolated": what no run measured yet)
UNIT_COSTS = Path(__file__).with_name("unit_costs.json")


def load_unit_costs(path: Path = UNIT_COSTS) -> dict[str, RunRates]:
    """Each entry of the unit costs file as RunRates, by its name ('cpu', 'cpu-loaded', 'cuda')."""
    data = json.loads(Path(path).read_text())
    return {name: RunRates(**entry) for name, entry in data.items() if not name.startswith("_")}


_FITS = load_unit_costs()
#: this project's 2-core VM quiet, the same VM shared with other jobs (load 9-12 on 2 CPUs), one GPU (its "fitted"
#: and "extrapolated" say which and how)
CPU_QUIET, CPU, H200 = _FITS["cpu"], _FITS["cpu-loaded"], _FITS["cuda"]
#: the load average per CPU of each CPU fit: the quiet one's (a run's own threads keep one per CPU busy) and the
#: loaded one's (9-12 on 2 CPUs); between them each unit cost is priced log-linearly in the load, beyond them the fit
QUIET_LOAD, LOADED_LOAD = 1.0, 5.25
#: each device type's unit costs (a device type not named takes the GPU's)
RATES = {"cpu": CPU, "cuda": H200}
#: each device type's unit costs as fitted quiet, load not read: what a plan that must be the same on every machine
#: prices by (fuzz: a seed plans the same cases anywhere; the wall budget, not the plan, decides how many run)
FITTED = {"cpu": CPU_QUIET, "cuda": H200}


def load_per_cpu() -> float:
    """This machine's load average over the last minute per CPU this process may use."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return os.getloadavg()[0] / cpus


def cpu_rates(load: float) -> RunRates:
    """The CPU unit costs at `load` (average per CPU): the quiet fit up to QUIET_LOAD, the loaded fit from
    LOADED_LOAD, and between them each cost geometrically between the two (a shared machine's fixed costs - process
    round trips, scheduling, compiles - grow with its contention; the FLOP rates are measured per run)."""
    if not math.isfinite(load) or load < 0:
        raise ValueError(f"load per CPU {load!r}: must be a finite number >= 0")
    t = min(1.0, max(0.0, math.log(max(load, QUIET_LOAD) / QUIET_LOAD) / math.log(LOADED_LOAD / QUIET_LOAD)))
    costs = {f.name: getattr(CPU_QUIET, f.name) ** (1 - t) * getattr(CPU, f.name) ** t for f in fields(RunRates)
             if f.type == "float"}
    return replace(CPU_QUIET if t < 0.5 else CPU, **costs, load_per_cpu=load)  # "fitted": the nearer fit's


def rates_here(device: torch.device, load: float | None = None) -> RunRates:
    """The unit costs of a job on `device` now: on a CPU priced at `load` (default: this machine's now)."""
    if device.type != "cpu":
        return RATES.get(device.type, H200)
    return cpu_rates(load_per_cpu() if load is None else load)


#: the H200's measured FLOP rates and memory, for estimates made without the GPU at hand (fitted.run_estimate)
H200_REFERENCE_RATE, H200_MEMORY = 22.4e12, 141 * 10 ** 9
H200_BASELINE_RATES = {torch.bfloat16: 693e12, torch.float16: 664e12, torch.float32: 50e12}
#: FLOP rates fixed per device type (float64 reference; the baseline's GEMM per dtype), for FITTED's plans: this
#: project's 2-core VM at load 0.75, the H200's
FITTED_FLOP_RATES = {"cpu": (6.1e10, {torch.float32: 1.9e11, torch.bfloat16: 4.2e11, torch.float16: 6.7e9}),
                     "cuda": (H200_REFERENCE_RATE, H200_BASELINE_RATES)}
