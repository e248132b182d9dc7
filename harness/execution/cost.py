"""What a matrix will cost before it runs (FLOPs, memory, the reference's time at rates measured here), or why not."""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass

import torch

from harness.execution.runner import baseline_budget
from harness.oracle.baseline import SCORE_TENSORS, dense_bytes
from harness.oracle.reference import block_rows, reference_attention, reference_flops, reference_budget
from harness.spec.case import AttentionCase, make_inputs
from harness.store.host import available_memory
from harness.store.schema import PHASES

#: a matrix whose reference would take longer than this is refused unless the override flag is given
LIMIT_S = 3600.0
OVERRIDE_FLAG = "--allow-expensive"
#: the calibration case: big enough that its GEMMs run at the rate a real case sees, small enough to cost
#: ~0.1 s (CPU: 3 GFLOP) or ~10 ms (GPU: 0.4 TFLOP)
CALIBRATION = {"cpu": AttentionCase(1, 8, 512, 128, "fp32"), "cuda": AttentionCase(1, 16, 4096, 128, "fp32")}


@dataclass(frozen=True)
class CaseCost:
    """One case's reference FLOPs and the peak bytes of inputs, reference, baseline."""

    case: AttentionCase
    reference_flops: int
    input_bytes: int
    reference_bytes: int
    baseline_bytes: int

    @classmethod
    def of(cls, case: AttentionCase, reference_budget_bytes: int, baseline_budget_bytes: int) -> "CaseCost":
        """The cost of `case` under the reference's and baseline's buffer budgets (beyond them they chunk)."""
        q_elems = case.batch * case.heads * case.seq_q * case.head_dim
        kv_elems = case.batch * case.kv_heads * case.seq_k * case.head_dim
        # q, k, v, d_out and the gradients of the first three, in the case's dtype
        inputs = (2 * q_elems + 2 * kv_elems) * 2 * case.dtype.itemsize
        # float64: q, d_out, out, dq; k, v, their transposes, dk, dv; two score-sized block buffers
        block = block_rows(case, reference_budget_bytes, "cuda")  # the budget alone, without the CPU's cap
        reference = (4 * q_elems + 6 * kv_elems) * 8 + 2 * case.batch * case.heads * block * case.seq_k * 8
        one_row = SCORE_TENSORS * case.batch * case.heads * case.seq_k * case.dtype.itemsize
        baseline = min(dense_bytes(case), max(baseline_budget_bytes, one_row))
        return cls(case, reference_flops(case), inputs, reference, baseline + inputs)

    @property
    def peak_bytes(self) -> int:
        """Inputs plus the larger of reference and baseline (they run one after the other)."""
        return self.input_bytes + max(self.reference_bytes, self.baseline_bytes)


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


def _duration(seconds: float) -> str:
    return (f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200
            else f"{seconds / 3600:.1f} h")


def _gib(n: int) -> str:
    return f"{n / 2 ** 30:.1f} GiB"


#: what every estimate assumes, printed with it
ASSUMED = ("Assumed: the reference runs at the rate of a calibration case timed here (best of "
           f"{REPEATS['reference']}), the baseline at a batched matmul's rate in its dtype (best of "
           f"{REPEATS['baseline']}), on a CPU one thread's rate times the threads; a busy machine runs slower")


@dataclass(frozen=True)
class MatrixCost:
    """The cost of cases on one device, with the rates used (FLOP/s): the reference's, the baseline's per dtype."""

    costs: tuple[CaseCost, ...]
    device: torch.device
    rate: float
    baseline_rates: dict[torch.dtype, float]
    memory: int

    @property
    def reference_seconds(self) -> float:
        return sum(c.reference_flops for c in self.costs) / self.rate

    @property
    def baseline_seconds(self) -> float:
        # the baseline does the reference's six dense GEMMs, in the case's dtype
        return sum(c.reference_flops / self.baseline_rates[c.case.dtype] for c in self.costs)

    @property
    def seconds(self) -> float:
        return self.reference_seconds + self.baseline_seconds

    def case_seconds(self, cost: CaseCost) -> float:
        return cost.reference_flops / self.rate + cost.reference_flops / self.baseline_rates[cost.case.dtype]

    @property
    def largest(self) -> CaseCost:
        return max(self.costs, key=lambda c: c.peak_bytes)

    def summary(self) -> str:
        """One line: the cases, the reference's and baseline's expected time, the largest memory need."""
        total = sum(c.reference_flops for c in self.costs)
        rates = ", ".join(f"{str(t).replace('torch.', '')} {r / 1e9:.3g}" for t, r in self.baseline_rates.items())
        return (f"{len(self.costs)} cases on {self.device}: float64 reference ~{_duration(self.reference_seconds)} "
                f"({total / 1e12:.3g} TFLOP at a measured {self.rate / 1e9:.3g} GFLOP/s), same-dtype baseline "
                f"~{_duration(self.baseline_seconds)} (measured GFLOP/s: {rates}); largest case needs "
                f"~{_gib(self.largest.peak_bytes)} ({self.largest.case.id}) of {_gib(self.memory)}. {ASSUMED}")

    def run_seconds(self, rates: "RunRates", backends: int, rounds: int) -> float:
        """The whole run's wall time at `rates`: start-up, reference, baseline, correctness calls, `rounds` rounds."""
        if rates.device_type != self.device.type:
            raise ValueError(f"rates of a {rates.device_type} device for a run on {self.device}")
        total = rates.startup_s + self.seconds
        for cost in self.costs:
            judged = cost.input_bytes // (2 * cost.case.dtype.itemsize)  # out, dq, dk, dv: as many as q, d_out, k, v
            total += backends * (rates.call_s + judged / rates.judged_per_s)
            slow = rates.slow_backends * rates.slow_calls_per_round * 2 * cost.reference_flops / rates.slow_rate
            total += rounds * (backends * len(PHASES) * rates.key_round_s + slow)
        return total

    def refusal(self) -> str | None:
        """Why this matrix should not run here (too long, or a case does not fit), or None."""
        problems = []
        if self.seconds > LIMIT_S:
            slow = max(self.costs, key=self.case_seconds)
            problems.append(f"the float64 reference and the same-dtype baseline would take ~"
                            f"{_duration(self.seconds)} on {self.device} (reference "
                            f"~{_duration(self.reference_seconds)}, baseline ~{_duration(self.baseline_seconds)}; "
                            f"limit {_duration(LIMIT_S)}; "
                            f"{slow.case.id} alone ~{_duration(self.case_seconds(slow))})")
        if self.largest.peak_bytes > self.memory:
            big = self.largest
            problems.append(f"{big.case.id} needs ~{_gib(big.peak_bytes)} (inputs {_gib(big.input_bytes)}, "
                            f"reference {_gib(big.reference_bytes)}, baseline {_gib(big.baseline_bytes)}) where "
                            f"{self.device} has {_gib(self.memory)}")
        if not problems:
            return None
        where = "a GPU" if self.device.type == "cpu" else "a larger GPU"
        return (f"{'; and '.join(problems)}. Run it on {where}, choose smaller shapes (a smaller --matrix, or "
                f"--seq and --batch with --preset/--hf-config), or pass {OVERRIDE_FLAG} to run it anyway")


@dataclass(frozen=True)
class RunRates:
    """A whole run's unit costs on one device (docs/measurements.md); slow_*: the dense naive and sdpa-math."""

    device_type: str
    startup_s: float
    call_s: float
    judged_per_s: float
    key_round_s: float
    slow_backends: int
    slow_calls_per_round: int
    slow_rate: float
    reference_rate: float
    baseline_rates: dict[torch.dtype, float]
    memory: int


#: one H200 (2026-11-30, torch 2.11), fitted to its gpu-smoke run with 7 backends (docs/design/execution.md)
H200 = RunRates("cuda", startup_s=60.0, call_s=0.5, judged_per_s=5.5e7, key_round_s=0.52, slow_backends=2,
                slow_calls_per_round=5, slow_rate=30e12, reference_rate=22.4e12,
                baseline_rates={torch.bfloat16: 693e12, torch.float16: 664e12, torch.float32: 50e12},
                memory=141 * 10 ** 9)
#: what the GPU estimate assumes: the H200 run's backends (naive, the five SDPA ones, flex) and --rounds' default
H200_BACKENDS, H200_ROUNDS = 7, 3


def run_estimate(cases: list[AttentionCase], rates: RunRates = H200, backends: int = H200_BACKENDS,
                 rounds: int = H200_ROUNDS) -> float:
    """Seconds a whole `pytest suites --benchmark` run of `cases` takes on the device `rates` were measured on."""
    budget = 8 * 2 ** 30  # the reference's and baseline's buffers: what a 141 GB device gives them, at most
    return matrix_cost(cases, torch.device(rates.device_type), rate=rates.reference_rate,
                       baseline_rates=rates.baseline_rates, memory=rates.memory, reference_budget_bytes=budget,
                       baseline_budget_bytes=budget).run_seconds(rates, backends, rounds)


def matrix_cost(cases: list[AttentionCase], device: torch.device, *, rate: float | None = None,
                baseline_rates: dict[torch.dtype, float] | None = None, memory: int | None = None,
                reference_budget_bytes: int | None = None, baseline_budget_bytes: int | None = None) -> MatrixCost:
    """The cost of `cases` on `device`; what is not given (rates, memory, budgets) is measured or queried there."""
    if not cases:
        raise ValueError("no cases to estimate")
    ref_budget = reference_budget(device) if reference_budget_bytes is None else reference_budget_bytes
    base_budget = baseline_budget(device) if baseline_budget_bytes is None else baseline_budget_bytes
    dtypes = sorted({c.dtype for c in cases}, key=str)
    rates = baseline_rates if baseline_rates is not None else {t: baseline_rate(device, t) for t in dtypes}
    return MatrixCost(tuple(CaseCost.of(c, ref_budget, base_budget) for c in cases), device,
                      reference_rate(device) if rate is None else rate, rates,
                      memory if memory is not None else torch.cuda.get_device_properties(device).total_memory
                      if device.type == "cuda" else available_memory())


def check_cost(cases: list[AttentionCase], device: torch.device, *, allow: bool) -> MatrixCost:
    """The cost of `cases` here; a ValueError with the figures and the override flag when refused and not `allow`."""
    cost = matrix_cost(cases, device)
    if not allow and (why := cost.refusal()):
        raise ValueError(why)
    return cost
