"""A run session: its recorder, verdicts, timing rounds, caches and executor, built from the command-line options."""

from __future__ import annotations

import secrets
from argparse import Namespace
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import torch

from harness.backends.base import Backend
from harness.backends.registry import modules_for
from harness.run.benchmark import PerfResult, measure_phase
from harness.calls.cache import RunCaches
from harness.calls.caller import allow_backward_replay
from harness.isolation.executor import Executor, make_executor
from harness.calls.outcome import BackendResult
from harness.run.prefetch import Prefetcher
from harness.run.recorder import RunRecorder
from harness.run.repro import RerunFlags, probe_repro_command, repro_command
from harness.run.rounds import RoundSchedule
from harness.run.runner import correctness_call, execute, prepare_case
from harness.isolation.supervisor import timeouts
from harness.measure.limits.peaks import RunPeaks
from harness.measure.stages import COUNT_CHECKED, COUNT_TIMED
from harness.measure.timing import TimingConfig
from harness.oracle import placement
from harness.oracle.prepared import PreparedCase
from harness.cases.case import AttentionCase
from harness.cases.matrices import FUZZ
from harness.store.environment import REPO_ROOT, environment, foreign_checkout, new_run_id
from harness.store.host import snapshot_clocks
from harness.store.kernels import keep_sources
from harness.store.schema import FAILING, NOT_TIMED, Row, TimingKey


def run_seed(seed: int | None) -> int:
    """The seed given (to reproduce a run), else one drawn now, which no code can predict."""
    return secrets.randbelow(2 ** 31) if seed is None else seed


class RunSession:
    """One run on `device`, in its folder under `results_root` (None: rows to `results_path` alone, when given)."""

    def __init__(self, device: torch.device, results_root: Path | str | None, seed: int = 0, *,
                 run_id: str | None = None, timing: TimingConfig | None = None, rounds: int = 1,
                 cpu_mem_budget: int | None = None, executor: Executor | None = None,
                 results_path: Path | str | None = None, call_timeouts: Sequence[tuple[str, float]] = ()):
        self.schedule = RoundSchedule(timing or TimingConfig(), rounds)
        self.device, self.seed, self.cpu_mem_budget = device, seed, cpu_mem_budget
        #: --call-timeout-s as given: a failing row's repro command repeats it (a timeout decides a verdict)
        self.call_timeouts = tuple(call_timeouts)
        self.executor = executor if executor is not None else make_executor()
        #: what correctness found, by (case id, backend name), without tensors: later stages time and summarize from it
        self.verdicts: dict[tuple[str, str], BackendResult] = {}
        self.cache = RunCaches()
        #: measured dense-matmul TFLOP/s per dtype name and copy bandwidth (GB/s), set by measure_peaks()
        self.peaks: dict[str, float] = {}
        self.bw_peak: float | None = None
        self.run_peaks = None
        self._crash_safe: Executor | None = None
        #: compiles ahead beside the run until its first timing (compile_ahead)
        self.prefetcher: Prefetcher | None = None
        allow_backward_replay()  # --no-isolate: compiled backends run in this process
        run_id = new_run_id() if run_id is None else run_id
        if results_root is None:
            self.recorder = RunRecorder(run_id, results_path=None if results_path is None else Path(results_path))
        else:
            env = environment(self.device, timing_mode="cpu-clock" if device.type != "cuda" else
                              "cuda-graph" if self.schedule.timing.cuda_graph else "cuda-events")
            # what `compare --remeasure` needs to time this run's keys again the same way (round_timing: the first
            # round's share of the timing budget)
            env.update(run_id=run_id, rounds=rounds, device=str(device), seed=seed, integrity=self.executor.integrity,
                       judging=placement.RULE,
                       round_timing=vars(self.schedule.timing_of(0)))
            self.recorder = RunRecorder(run_id, Path(results_root) / run_id, env)
        # what the suites read of the run
        self.run_id, self.run_dir, self.writer, self.env = (self.recorder.run_id, self.recorder.run_dir,
                                                            self.recorder.writer, self.recorder.env)
        self.rounds = self.schedule.count
        self._log_dir = None if self.run_dir is None else str(self.run_dir / "workers")  # the workers' logs

    @classmethod
    def from_options(cls, options: Namespace, device: torch.device, cases: Sequence[AttentionCase],
                     matrix: str) -> "RunSession":
        """The run `options` describe (pytest's config.option or cli/options.py's Namespace), ready for `cases`."""
        if why := foreign_checkout(Path.cwd()):
            raise ValueError(why)
        run_id, root = new_run_id(), Path(options.results_dir)
        timed = getattr(options, "benchmark_enabled", False)
        default, overrides = timeouts(options.call_timeout_s)
        executor = make_executor(device, isolate=options.isolate, timeout_s=default, timeouts=overrides,
                                 log_dir=str(root / run_id / "workers"))
        budget_ms = getattr(options, "timing_budget_ms", None)
        timing = TimingConfig() if budget_ms is None else TimingConfig.for_budget(budget_ms,
                                                                                   cuda_graph=options.cuda_graph)
        mem_gb = getattr(options, "cpu_mem_budget_gb", None)
        session = cls(device, root, run_seed(options.seed), run_id=run_id, timing=timing, executor=executor,
                      cpu_mem_budget=None if mem_gb is None else int(mem_gb * 2 ** 30),
                      rounds=getattr(options, "rounds", 1), call_timeouts=options.call_timeout_s)
        session.env["benchmark"] = timed  # a run stopped before its timings is no correctness-only run
        if timed:
            session.measure_peaks(sorted({c.dtype for c in cases}, key=str))
        # check --case, check --fuzz, --matrix fuzz: cases no matrix builds again
        named = getattr(options, "case", None) or getattr(options, "fuzz", False) or matrix == FUZZ
        session.describe_cases({"preset": options.preset} if options.preset else
                               {"hf_config": str(Path(options.hf_config).resolve())} if options.hf_config else
                               {"case_ids": [c.spelled_id for c in cases]} if named else
                               {"matrix": matrix}, list(options.backend_module))
        return session

    def save_env(self) -> None:
        self.recorder.save_env()

    def describe_cases(self, cases: dict, backend_modules: list[str]) -> None:
        """Record where the run's cases came from and the plugin modules its backends need."""
        self.env["cases"] = cases
        self.env["backend_modules"] = [str(Path(m).resolve()) if m.endswith(".py") else m for m in backend_modules]
        if self.run_dir is not None:  # the kernels timed, kept: compare --remeasure times each run's own
            self.env["backend_sources"] = keep_sources(self.run_dir, backend_modules)
        # where the code was: a re-measurement in another checkout of it finds the plugin modules that lay inside
        self.env["checkout"] = str(REPO_ROOT)
        self.save_env()

    def measure_peaks(self, dtypes) -> None:
        """The device's dense-matmul TFLOP/s per dtype and copy bandwidth (measure.limits.peaks), sampled again at finish."""
        self.run_peaks = RunPeaks(self.device, dtypes)
        self.peaks, self.bw_peak = self.run_peaks.judged, self.run_peaks.gbps
        self.env.update(matmul_peak_tflops=self.run_peaks.tflops, copy_bandwidth_gbps=self.bw_peak,
                        peaks=self.run_peaks.record(), timing_config=vars(self.schedule.timing))
        self.save_env()

    def crash_safe_executor(self) -> Executor:
        """The executor for probes designed to crash a backend: workers, even under --no-isolate."""
        if self.executor.isolated:
            return self.executor
        if self._crash_safe is None:
            self._crash_safe = make_executor(self.device, isolate=True, log_dir=self._log_dir)
        return self._crash_safe

    def compile_ahead(self, pairs: Sequence[tuple[AttentionCase, Backend]]) -> None:
        """Compile ahead (run/prefetch.py) the calls of `pairs` whose backend compiles per shape."""
        if self.device.type != "cpu" or not self.executor.isolated or self.prefetcher is not None \
                or "prefetch" in self.env:
            return
        calls = [(b, correctness_call(b, c, self.device, self.seed)) for c, b in pairs
                 if b.compiles_per_shape and not b.can_run(c, self.device)]
        if calls:
            self.prefetcher = Prefetcher(calls, self.device, self._log_dir)

    def enter_stage(self, name: str) -> None:
        """The run enters stage `name` (suite/plugin.py STAGES); the benchmark stage stops the prefetcher."""
        if name == "benchmark":
            self._stop_prefetch()
        self.recorder.enter_stage(name)

    def _stop_prefetch(self) -> None:
        """End the prefetcher and say in env.json what it did."""
        if self.prefetcher is not None:
            self.prefetcher.stop()
            self.env["prefetch"] = self.prefetcher.summary()
            self.prefetcher = None

    def finish(self, complete: bool = True) -> None:
        """Stop the workers, drop the caches, record the end state (clocks, restarts, `complete`), fold the CSV."""
        self._stop_prefetch()
        self.executor.close()
        if self._crash_safe is not None:
            self._crash_safe.close()
        self.cache.clear()
        if self.run_peaks is not None:  # the end samples: recorded beside the rows, and auditing their rejections
            self.run_peaks.measure_end()
            self.env["peaks"] = self.run_peaks.record(self.perf_rows.values())
        if self.run_dir is not None:
            self.recorder.finish(complete=complete, clocks_end=snapshot_clocks(self.device),
                                 worker_restarts=self.executor.worker_restarts())

    # correctness
    def prepared(self, case: AttentionCase) -> PreparedCase:
        """Inputs, reference and naive errors for `case`, kept for the next few lookups."""
        def make() -> PreparedCase:
            prepared = prepare_case(case, self.device, self.seed)
            self.cache.answers.get(case, lambda: replace(prepared, inputs=None))  # timing judges against it
            return prepared

        return self.cache.prepared.get(case, make)

    def check(self, case: AttentionCase, backend: Backend) -> BackendResult:
        """Run `backend` on `case` against the reference, write its verdict rows and remember the verdict."""
        if self.prefetcher is not None:
            self.prefetcher.claim(backend, case)
        result = execute(backend, self.prepared(case), self.run_id, executor=self.executor)
        if any(r.status in FAILING for r in result.rows):  # the command that reruns it, in the row as it is stored
            command = self.repro_command(case, backend.name)
            result = replace(result, rows=[replace(r, repro=command) if r.status in FAILING else r
                                           for r in result.rows])
        self.recorder.write(result.rows)
        self.recorder.count(COUNT_CHECKED)
        self.verdicts[(case.id, backend.name)] = result.released()
        return result

    def _rerun_flags(self, backend: str) -> RerunFlags:
        # the module that registered this backend alone: a process may have loaded others (its own, a test's)
        return RerunFlags.of(modules_for(backend), self.device, isolate=self.executor.isolated,
                             call_timeouts=self.call_timeouts)

    def repro_command(self, case: AttentionCase, backend: str) -> str:
        """`python -m harness check ... --case 'ID' --seed S`: reruns `case` on `backend` with this run's inputs."""
        return repro_command(case, backend, self.seed, self._rerun_flags(backend))

    def write_probe(self, rows: list[Row], test_id: str, matrix: str) -> list[Row]:
        """A probe test's rows written, each failing one with the command that reruns that test alone (its pytest
        id) on this run's inputs; the rows as written."""
        def command(backend: str) -> str:
            return probe_repro_command(test_id, backend, self.seed, matrix, self._rerun_flags(backend))
        rows = [replace(r, repro=command(r.backend)) if r.status in FAILING else r for r in rows]
        self.writer.write(rows)
        return rows

    def verdict(self, case: AttentionCase, backend: Backend) -> BackendResult:
        """The correctness result of this session, computed (and recorded) now if the suite did not run it."""
        known = self.verdicts.get((case.id, backend.name))
        return known if known is not None else self.check(case, backend).released()

    # the benchmark
    def benchmark_round(self, case: AttentionCase, backend: Backend, phase: str, round_index: int,
                        verdict: BackendResult) -> PerfResult | None:
        """Time and record round `round_index` of one key; None when an earlier round of this key ended it."""
        self._stop_prefetch()  # nothing compiles beside a timing
        key = TimingKey(case.id, backend.name, phase)
        if (timing_round := self.schedule.next(key, round_index)) is None:
            return None
        # the verified answer (kept within cache.ANSWER_BYTES), with the seeded inputs when this process holds them
        prepared = self.cache.prepared.get(case) if case in self.cache.prepared else self.cache.answers.get(
            case, lambda: replace(self.prepared(case), inputs=None))
        result = measure_phase(backend, prepared, phase, verdict,
                               config=self.schedule.timing_of(round_index), peaks=self.peaks, run_id=self.run_id,
                               cpu_mem_budget=self.cpu_mem_budget, timing_round=timing_round,
                               executor=self.executor, bw_peak=self.bw_peak, pools=self.cache.pools)
        self.recorder.write([result.row])
        if result.row.timing_status != NOT_TIMED:  # a round the worker was asked for (a key refused ahead costs none)
            self.recorder.count(COUNT_TIMED)
        if result.measurement is not None:
            self.recorder.write_samples(key, result.measurement.samples_ms, round_index)
        self.schedule.record(result.row, result.pooled)
        return result

    @property
    def perf_rows(self) -> dict[TimingKey, Row]:
        """Timing key -> its latest perf row (pooled over its rounds so far), for the end-of-run summary."""
        return self.schedule.rows
