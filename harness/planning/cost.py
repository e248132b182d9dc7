"""What a job will cost before it runs (FLOPs, memory, every step's time at rates.py's rates), or why not."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.backends.base import Backend
from harness.backends.registry import built_in_names
from harness.run.runner import backward_reason, baseline_budget
from harness.measure.timing import TimingConfig, call_plan, looks_for
from harness.oracle.baseline import SCORE_TENSORS, dense_bytes
from harness.oracle.reference import block_rows, reference_flops, reference_budget
from harness.cases.case import AttentionCase, answer_elements
from harness.planning.rates import (H200, RATES, REPEATS, RunRates, baseline_rate, rates_here, reference_rate)
from harness.store.host import available_memory
from harness.store.schema import FWD, FWD_BWD, PHASES

#: a job whose whole estimate (JobCost: every step) is longer than this is refused unless the override flag is given
LIMIT_S = 3600.0
OVERRIDE_FLAG = "--allow-expensive"

def planned_calls(estimate_ms: float, cfg: TimingConfig, *, device_type: str, estimated: bool) -> int:
    """How many calls measure.timing.measure makes of a call that takes `estimate_ms`: its own plan (call_plan), with
    its estimate calls where none is given (`estimated` False)."""
    looks = 0 if estimated else (1 if device_type == "cuda" else looks_for(estimate_ms, cfg))
    return call_plan(estimate_ms, cfg, device_type=device_type, looks=looks, warm=False).calls


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


def _duration(seconds: float) -> str:
    return (f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200
            else f"{seconds / 3600:.1f} h")


def _gib(n: int) -> str:
    return f"{n / 2 ** 30:.1f} GiB"


#: what every estimate assumes, printed with it
ASSUMED = ("Assumed: the reference runs at the rate of a calibration case timed here (best of "
           f"{REPEATS['reference']}), the baseline at a batched matmul's rate in its dtype (best of "
           f"{REPEATS['baseline']}), on a CPU one thread's rate times the threads; each backend's calls at the "
           "baseline's rate times its declared relative_speed, the timing rounds' calls as measure() plans them, and "
           "fixed costs per call, round, compile and probe fitted on one 2-core VM quiet and loaded, priced between "
           "the two by the load average here (docs/measurements.md); a compile inductor has cached costs less")


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
                f"~{_gib(self.largest.peak_bytes)} ({self.largest.case.id}) of {_gib(self.memory)}")

    def memory_problem(self) -> str | None:
        """Why the largest case does not fit this device's memory, or None."""
        big = self.largest
        if big.peak_bytes <= self.memory:
            return None
        return (f"{big.case.id} needs ~{_gib(big.peak_bytes)} (inputs {_gib(big.input_bytes)}, reference "
                f"{_gib(big.reference_bytes)}, baseline {_gib(big.baseline_bytes)}) where {self.device} has "
                f"{_gib(self.memory)}")


@dataclass(frozen=True)
class Job:
    """What a command runs besides each case's reference and baseline: the backends' correctness calls always;
    timing of `phases` (all cases, or per case id) in `rounds` at `timing`; the probes stage; a run session's start
    (`session`: the suites, `check`); `advisor`: recommend's order (each backend timed in one round right after its
    verdict, no session), with its deployment checks when `checks`."""

    backends: tuple[Backend, ...]
    phases: tuple[str, ...] | dict[str, tuple[str, ...]] = ()
    rounds: int = 1
    timing: TimingConfig = field(default_factory=TimingConfig)
    probes: bool = False
    session: bool = True
    advisor: bool = False
    checks: bool = False

    def phases_of(self, case: AttentionCase) -> tuple[str, ...]:
        return self.phases.get(case.id, ()) if isinstance(self.phases, dict) else self.phases


@dataclass(frozen=True)
class Step:
    """One estimated step of a job: its stage, what it is, its seconds, and what it is of (the progress lines' key:
    (case id,) for the reference and baseline, (case id, backend), (case id, backend, phase, round), ...)."""

    stage: str
    what: str
    seconds: float
    key: tuple = ()


#: the stages of a job's steps, in the order the summary names them
JOB_STAGES = ("start", "probes", "reference", "correctness", "compile", "timing", "checks")
#: how the estimate's line names a stage where its name is too short
STAGE_WORDS = {"reference": "reference and baseline", "correctness": "correctness calls", "compile": "compiles",
               "timing": "timing rounds", "checks": "deployment checks"}


@dataclass(frozen=True)
class JobCost:
    """A whole job's estimate on one device: its steps at the matrix's measured rates and the device's unit costs."""

    matrix: MatrixCost
    rates: RunRates
    steps: tuple[Step, ...]
    #: the backends whose speed the estimate guesses: plugins declaring no relative_speed for this device
    guessed: tuple[str, ...] = ()

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)

    def stage_seconds(self) -> dict[str, float]:
        """Seconds per stage of JOB_STAGES (those with steps), in that order."""
        return {name: sum(s.seconds for s in self.steps if s.stage == name) for name in JOB_STAGES
                if any(s.stage == name for s in self.steps)}

    def seconds_of(self, *prefix, stages: tuple[str, ...] = JOB_STAGES) -> float:
        """Seconds of the steps in `stages` whose key starts with `prefix`."""
        return sum(s.seconds for s in self.steps if s.key[:len(prefix)] == prefix and s.stage in stages)

    def breakdown(self) -> str:
        """'start ~25 s, reference and baseline ~20 min, ...': each stage's seconds."""
        return ", ".join(f"{STAGE_WORDS.get(name, name)} ~{_duration(sec)}"
                         for name, sec in self.stage_seconds().items())

    def summary(self) -> str:
        """One line: the whole job's estimate by stage, then the matrix's figures and what the estimate assumes."""
        load = self.rates.load_per_cpu
        at = "" if load is None else f", fixed costs at a load average of {load:.2g} per CPU"
        guess = (f" A guess for {', '.join(self.guessed)}: a plugin that declares no relative_speed for "
                 f"{self.matrix.device.type} is assumed at the baseline's rate (one 4x slower makes this 4x short; "
                 "declare relative_speed on its class to price it)" if self.guessed else "")
        extrapolated = (f" An extrapolation: {self.rates.extrapolated} (scripts/refit_rates.py refits them from a "
                        "run's stage clocks)." if self.rates.extrapolated else "")
        return (f"estimated ~{_duration(self.seconds)} ({self.seconds:.0f} s) in all ({self.breakdown()}{at}); "
                f"{self.matrix.summary()}. "
                f"{ASSUMED}.{guess}{extrapolated}")

    def refusal(self) -> str | None:
        """Why this job should not run here (over LIMIT_S in all, or a case does not fit), or None."""
        problems = []
        if self.seconds > LIMIT_S:
            slow = max(self.steps, key=lambda s: s.seconds)
            problems.append(f"the whole job would take ~{_duration(self.seconds)} on {self.matrix.device} "
                            f"({self.breakdown()}; limit {_duration(LIMIT_S)}; the longest step, {slow.what}, "
                            f"~{_duration(slow.seconds)})")
        if memory := self.matrix.memory_problem():
            problems.append(memory)
        if not problems:
            return None
        where = "a GPU" if self.matrix.device.type == "cpu" else "a larger GPU"
        return (f"{'; and '.join(problems)}. Run it on {where}, choose smaller shapes (a smaller --matrix, or "
                f"--seq and --batch with --preset/--hf-config), or pass {OVERRIDE_FLAG} to run it anyway")


def _runs(backend: Backend, case: AttentionCase, device: torch.device) -> bool:
    """Whether `backend`'s declarations let it run `case` on `device` (a library missing is not known here)."""
    return (backend.devices is None or device.type in backend.devices) and not backend.can_run(case, device)


def _call_seconds(matrix: MatrixCost, rates: RunRates, backend: Backend, case: AttentionCase, grads: bool) -> float:
    """One call: its arithmetic at the same-dtype GEMM rate times the backend's declared relative speed here, at
    least the device's floor."""
    speed = backend.relative_speed.get(matrix.device.type, 1.0)
    return max(rates.call_floor_s, reference_flops(case, grads=grads) / (matrix.baseline_rates[case.dtype] * speed))


def correctness_steps(matrix: MatrixCost, rates: RunRates, backend: Backend, case: AttentionCase) -> list[Step]:
    """A backend's correctness call on a case (no-grad, then forward and backward where it has one), judged, and
    its compiles when it compiles per shape."""
    grads = not backward_reason(backend, case, matrix.device)
    seconds = (rates.call_s + _call_seconds(matrix, rates, backend, case, False)
               + (_call_seconds(matrix, rates, backend, case, True) if grads else 0.0)
               + (answer_elements(case, FWD) + answer_elements(case, FWD_BWD if grads else FWD)) / rates.judged_per_s)
    key = (case.id, backend.name)
    steps = [Step("correctness", f"{case.id}: {backend.name}'s correctness calls", seconds, key)]
    if backend.compiles_per_shape:
        steps.append(Step("compile", f"{case.id}: {backend.name}'s compiles", rates.compile_s * (1 + grads), key))
    return steps


def timing_step(matrix: MatrixCost, rates: RunRates, backend: Backend, case: AttentionCase, phase: str,
                timing: TimingConfig, rounds: int, index: int) -> Step:
    """Round `index` of `rounds` of one timed phase: the calls `measure` makes at this call's estimated latency (a
    backward's each rebuild their forward), and the round's fixed cost."""
    grads = phase != FWD
    call = _call_seconds(matrix, rates, backend, case, grads)
    calls = planned_calls(call * 1e3, timing.share(rounds, index), device_type=matrix.device.type,
                          estimated=index > 0)
    # the answers observed are checked where the calls ran (an honest one is the verified answer scaled): in key_round_s
    return Step("timing", f"{case.id}: {backend.name} {phase} timing round {index + 1}",
                rates.key_round_s + calls * call, (case.id, backend.name, phase, index))


def checks_step(matrix: MatrixCost, rates: RunRates, backend: Backend, case: AttentionCase, phase: str) -> Step:
    """recommend's deployment checks: a small-shape compile, and the timed phase twice at the workload's size."""
    seconds = rates.checks_s + 2 * _call_seconds(matrix, rates, backend, case, phase != FWD)
    return Step("checks", f"{case.id}: {backend.name}'s deployment checks", seconds, (case.id, backend.name, "checks"))


def _timed(job: Job, backend: Backend, case: AttentionCase, device: torch.device) -> tuple[str, ...]:
    """The phases of `case` the job times for `backend`: a phase with a backward only where it has one."""
    return tuple(p for p in job.phases_of(case) if p == FWD or not backward_reason(backend, case, device))


def job_cost(matrix: MatrixCost, job: Job, rates: RunRates | None = None) -> JobCost:
    """Every step of `job` on `matrix`'s cases in the order the commands run them: the start, the probes, per case
    its reference and baseline then each backend's correctness calls (and recommend's timing and checks), then the
    suites' timing rounds, round-major; a backend whose declarations refuse a case costs nothing there."""
    rates = rates if rates is not None else RATES.get(matrix.device.type, H200)
    device = matrix.device
    if rates.device_type != device.type:
        raise ValueError(f"rates of a {rates.device_type} device for a job on {device}")
    backends = [b for b in job.backends if b.devices is None or device.type in b.devices]
    steps = [Step("start", "start-up", rates.startup_s)]
    if job.session and not job.advisor:
        steps.append(Step("start", "the run session's start", rates.session_s, ("session",)))
    if job.probes:
        steps += [Step("probes", f"{b.name}'s probes", rates.probes_s
                       + (rates.compile_s * rates.probe_graphs if b.compiles_per_shape else 0.0), ("probes", b.name))
                  for b in backends]
    for cost in matrix.costs:
        case = cost.case
        steps.append(Step("reference", f"{case.id}: float64 reference and same-dtype baseline",
                          rates.case_s + matrix.case_seconds(cost), (case.id,)))
        for b in (b for b in backends if _runs(b, case, device)):
            steps += correctness_steps(matrix, rates, b, case)
            if job.advisor:  # recommend: each backend timed right after its verdict, in one round
                steps += [timing_step(matrix, rates, b, case, p, job.timing, 1, 0)
                          for p in _timed(job, b, case, device)]
        if job.advisor and job.checks:  # those verified: the checks; the others' mask path costs next to nothing
            steps += [checks_step(matrix, rates, b, case, p) for b in backends if _runs(b, case, device)
                      for p in _timed(job, b, case, device)]
    if not job.advisor:
        steps += [timing_step(matrix, rates, b, c.case, p, job.timing, job.rounds, r) for r in range(job.rounds)
                  for c in matrix.costs for b in backends if _runs(b, c.case, device)
                  for p in _timed(job, b, c.case, device)]
        if job.probes and any(job.phases_of(c.case) for c in matrix.costs):
            steps.append(Step("timing", "timing fidelity and the reference's long-sequence memory",
                              rates.fidelity_s, ("fidelity",)))
    guessed = tuple(b.name for b in backends if b.name not in built_in_names()
                    and device.type not in b.relative_speed)
    return JobCost(matrix, rates, tuple(steps), guessed)


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


def check_cost(cases: list[AttentionCase], device: torch.device, job: Job, *, allow: bool,
               load: float | None = None) -> JobCost:
    """The whole job's cost here, its fixed costs at this machine's load (`load`: per CPU, default read now); a
    ValueError with the figures and the override flag when refused and not `allow`."""
    cost = job_cost(matrix_cost(cases, device), job, rates_here(device, load))
    if not allow and (why := cost.refusal()):
        raise ValueError(why)
    return cost
