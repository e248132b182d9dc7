"""A run: its id and directory, the results writers, the environment, and what earlier stages found."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.backends.base import Backend
from harness.execution.benchmark import InputsOnly, PerfResult, measure_phase
from harness.execution.cache import LRU
from harness.execution.executor import Executor
from harness.execution.outcome import BackendResult
from harness.execution.runner import execute, prepare_case
from harness.execution.timed import allow_backward_replay
from harness.measure import stages
from harness.measure.timing import Measurement, TimingConfig
from harness.oracle.prepared import PreparedCase
from harness.spec.case import AttentionCase, make_inputs
from harness.store.environment import REPO_ROOT, environment, new_run_id
from harness.store.load import compact
from harness.store.run_dir import RESULTS, SAMPLES, write_env
from harness.store.schema import TIMED, Row, TimingKey
from harness.store.writer import ResultsWriter, SamplesWriter


@dataclass
class RunSession:
    device: torch.device
    results_root: Path
    seed: int = 0
    run_id: str = field(default_factory=new_run_id)
    timing: TimingConfig = field(default_factory=TimingConfig)
    #: measurement rounds per timed key, spread over the run (the suite orders them round-major), so a
    #: key's samples see the run's changing conditions and compare can tell a transient from a regression
    rounds: int = 1
    #: measured dense-matmul TFLOP/s per dtype name, filled by measure_peaks() when benchmarking
    peaks: dict = field(default_factory=dict)
    #: measured device copy bandwidth (GB/s, read + write), filled by measure_peaks(): the memory roofline
    bw_peak: float | None = None
    cpu_mem_budget: int | None = None
    #: where backend calls run: this process, or supervised workers (execution.isolation); a session's own
    #: in-process executor, so a KeyboardInterrupt it remembers is this run's only
    executor: Executor = field(default_factory=Executor)

    def __post_init__(self):
        if self.rounds < 1:
            raise ValueError(f"rounds={self.rounds!r}: must be >= 1")
        self._started = time.monotonic()
        stages.CLOCK.reset()
        #: seconds spent in each suite stage's tests (correctness, probes, benchmark), from pytest's reports
        self.test_seconds: dict[str, float] = {}
        allow_backward_replay()  # --no-isolate: compiled backends run in this process
        self.run_dir = Path(self.results_root) / self.run_id
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.writer = ResultsWriter(self.run_dir / RESULTS)
        self.samples = SamplesWriter(self.run_dir / SAMPLES)
        #: (case id, backend name) -> the correctness verdict (rows and checks; the tensors are dropped once
        #: judged), so later stages time only what passed
        self.verdicts: dict[tuple[str, str], BackendResult] = {}
        #: timing key -> the latest perf row, for the end-of-run summary
        self.perf_rows: dict[TimingKey, Row] = {}
        #: timing key -> its rounds measured so far, pooled
        self.timings: dict[TimingKey, Measurement] = {}
        #: timing key -> (peak bytes, method) of its first timed round: memory does not change between rounds
        self.round_memory: dict[TimingKey, tuple[int, str]] = {}
        # tests run case-major: two cases are enough and bound memory
        self._prepared: LRU = LRU(2)
        self._inputs: LRU = LRU(2)
        self._crash_safe: Executor | None = None
        self.env = environment(self.device, timing_mode=self.timing_mode)
        self.env["run_id"] = self.run_id
        self.env["rounds"] = self.rounds
        # what `compare --remeasure` needs to time this run's keys again the same way
        self.env["device"] = str(self.device)
        self.env["seed"] = self.seed
        self.env["round_timing"] = vars(self.round_timing)
        self.save_env()

    def describe_cases(self, cases: dict, backend_modules: list[str]) -> None:
        """Record where the run's cases came from ({'matrix': name} or {'preset': ...} / {'hf_config': path})
        and the plugin modules its backends need."""
        self.env["cases"] = cases
        self.env["backend_modules"] = [str(Path(m).resolve()) if m.endswith(".py") else m for m in backend_modules]
        # where the code was: a re-measurement in another checkout of it finds the plugin modules that lay inside
        self.env["checkout"] = str(REPO_ROOT)
        self.save_env()

    @property
    def timing_mode(self) -> str:
        if self.device.type != "cuda":
            return "cpu-clock"
        return "cuda-graph" if self.timing.cuda_graph else "cuda-events"

    def crash_safe_executor(self) -> Executor:
        """The executor for probes designed to crash a backend (empty tensors): the run's own when it isolates,
        else workers kept for them alone, so that --no-isolate still survives them."""
        if self.executor.isolated:
            return self.executor
        if self._crash_safe is None:
            from harness.execution.isolation import IsolatedExecutor
            self._crash_safe = IsolatedExecutor(self.device, log_dir=str(self.run_dir / "workers"))
        return self._crash_safe

    def finish(self) -> None:
        """Stop the workers; clocks/power/throttle state after the run (compare warns when they moved), the
        workers restarted after a crash or timeout; then fold the CSV."""
        from harness.store.environment import snapshot_clocks
        self.executor.close()
        if self._crash_safe is not None:
            self._crash_safe.close()
        self.env["clocks_end"] = snapshot_clocks(self.device)
        self.env["worker_restarts"] = self.executor.worker_restarts()
        self.env["time_spent"] = self.time_spent()
        self.save_env()
        compact(self.writer.path)

    def time_spent(self) -> dict:
        """Where the run's wall time went so far: per suite stage, and per harness stage (measure.stages: the
        reference, worker start-up, the backends' forward, judging, timing...), exclusive seconds and counts."""
        return {"wall_s": round(time.monotonic() - self._started, 3),
                "tests_s": {k: round(v, 3) for k, v in self.test_seconds.items()},
                "stages": {name: {"s": round(s, 3), "n": n} for name, (s, n) in stages.CLOCK.snapshot().items()}}

    def save_env(self) -> None:
        write_env(self.run_dir, self.env)

    def prepared(self, case: AttentionCase) -> PreparedCase:
        """Inputs, reference and naive errors for `case`, computed once and kept for the next few lookups."""
        return self._prepared.get(case, lambda: prepare_case(case, self.device, self.seed))

    def timing_inputs(self, case: AttentionCase) -> PreparedCase | InputsOnly:
        """What timing needs (a verified backend, or a check that only times): the prepared case if still
        held, else its inputs alone (the same seeded tensors; drawn by the worker when isolated), kept for the
        next few lookups; the reference is not recomputed to time."""
        if case in self._prepared:
            return self._prepared.get(case)
        if self.executor.isolated:
            return InputsOnly(case, self.device, None, self.seed)
        return self._inputs.get(case, lambda: InputsOnly(case, self.device, make_inputs(case, self.device, self.seed),
                                                         self.seed))

    @property
    def round_timing(self) -> TimingConfig:
        """One round's share of the timing budget: all rounds together cost about what one round would."""
        return self.timing.share(self.rounds)

    def check(self, case: AttentionCase, backend: Backend) -> BackendResult:
        """Run `backend` on `case` against the reference and record its verdict rows."""
        result = execute(backend, self.prepared(case), self.run_id, executor=self.executor)
        self.record(case, backend, result)
        return result

    def record(self, case: AttentionCase, backend: Backend, result: BackendResult) -> None:
        """Write the rows and keep the verdict (without its tensors, which may be large on a GPU)."""
        self.verdicts[(case.id, backend.name)] = result.released()
        self.writer.write(result.rows)

    def verdict(self, case: AttentionCase, backend: Backend) -> BackendResult:
        """The correctness result of this session, computed (and recorded) now if the suite did not run it."""
        key = (case.id, backend.name)
        if key not in self.verdicts:
            self.check(case, backend)
        return self.verdicts[key]

    def benchmark_round(self, case: AttentionCase, backend: Backend, phase: str, round_index: int) -> PerfResult | None:
        """Time one round of one key with the rounds before it pooled in, and record it. None when an earlier
        round of this key already ended it (its row says why)."""
        key = TimingKey(case.id, backend.name, phase)
        before = self.perf_rows.get(key)  # None: no earlier round of this key ran (e.g. this item run alone)
        if before is not None and before.timing_status != TIMED:
            return None
        result = measure_phase(backend, self.timing_inputs(case), phase, self.verdict(case, backend),
                               config=self.round_timing, peaks=self.peaks, run_id=self.run_id,
                               cpu_mem_budget=self.cpu_mem_budget, prior=self.timings.get(key),
                               known_memory=self.round_memory.get(key), executor=self.executor,
                               bw_peak=self.bw_peak)
        if result.measurement is None and before is not None:
            result.row = result.row.with_(timing_reason=f"round {round_index + 1} of {self.rounds}: "
                                                        f"{result.row.timing_reason}; the latency columns pool the "
                                                        "rounds timed before it")
        self.record_perf(result, round_index)
        return result

    def record_perf(self, result: PerfResult, round_index: int = 0) -> None:
        """Append the row (latency pooled over the rounds so far) and this round's raw samples, labelled
        with `round_index`. A key once flagged suspicious (faster than the matmul roofline) stays flagged,
        with that round's timing reason: the results file folds rows, so a later row could not clear it."""
        row = result.row
        key = row.key
        before = self.perf_rows.get(key)
        if before is not None and before.suspicious and row.timing_status == TIMED and not row.suspicious:
            row = row.with_(suspicious=True, timing_reason=before.timing_reason)
        self.writer.write([row])
        if result.measurement is not None:
            self.samples.write(self.run_id, *key, result.measurement.samples_ms, round_index=round_index)
            self.timings[key] = result.pooled
            self.round_memory.setdefault(key, (row.peak_mem_bytes, row.mem_method))
        self.perf_rows[key] = row

    def measure_peaks(self, dtypes) -> None:
        from harness.measure.roofline import measure_peaks
        self.peaks = measure_peaks(self.device, dtypes)
        self.env["matmul_peak_tflops"] = self.peaks
        from harness.measure.bandwidth import copy_bandwidth_gbps
        self.bw_peak = round(copy_bandwidth_gbps(self.device), 3)
        self.env["copy_bandwidth_gbps"] = self.bw_peak
        self.env["timing_config"] = vars(self.timing)
        self.save_env()
