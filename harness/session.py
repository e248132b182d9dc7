"""A run: its id and directory, the results writer, the environment, and what earlier stages found."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from math import ceil
from pathlib import Path

import torch

from harness.backends.base import Backend
from harness.case import AttentionCase, make_inputs
from harness.env import environment, new_run_id
from harness.results import ResultsWriter, SamplesWriter
from harness.perf import InputsOnly
from harness.runner import BackendResult, PreparedCase, execute, prepare_case
from harness.timing import TimingConfig


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
    cpu_mem_budget: int | None = None
    #: (case id, backend name) -> the correctness result, so later stages time only what passed
    verdicts: dict = field(default_factory=dict)
    _prepared: OrderedDict = field(default_factory=OrderedDict)

    def __post_init__(self):
        if self.rounds < 1:
            raise ValueError(f"rounds={self.rounds!r}: must be >= 1")
        self.run_dir = Path(self.results_root) / self.run_id
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.writer = ResultsWriter(self.run_dir / "results.csv")
        self.samples = SamplesWriter(self.run_dir / "samples.csv")
        #: (case id, backend, phase) -> perf row, for the end-of-run summary
        self.perf_rows: dict = {}
        #: (case id, backend, phase) -> the samples of each round measured so far
        self.round_samples: dict = {}
        #: (case id, backend, phase) -> (peak bytes, method) of its first timed round: memory does not change
        #: between rounds, so later rounds reuse it
        self.round_memory: dict = {}
        self._inputs: OrderedDict = OrderedDict()
        self.env = environment(self.device, timing_mode=self.timing_mode)
        self.env["run_id"] = self.run_id
        self.env["rounds"] = self.rounds
        self.save_env()

    @property
    def timing_mode(self) -> str:
        if self.device.type != "cuda":
            return "cpu-clock"
        return "cuda-graph" if self.timing.cuda_graph else "cuda-events"

    def finish(self) -> None:
        """Clocks/power/throttle state after the run (compare warns when they moved), then fold the CSV."""
        from harness.env import snapshot_clocks
        from harness.results import compact
        self.env["clocks_end"] = snapshot_clocks(self.device)
        self.save_env()
        compact(self.writer.path)

    def save_env(self) -> None:
        (self.run_dir / "env.json").write_text(json.dumps(self.env, indent=2, default=str) + "\n")

    def prepared(self, case: AttentionCase) -> PreparedCase:
        """Inputs, reference and naive errors for `case`, computed once and kept for the next few lookups."""
        if case not in self._prepared:
            self._prepared[case] = prepare_case(case, self.device, self.seed)
            while len(self._prepared) > 2:  # tests run case-major; two is enough and bounds memory
                self._prepared.popitem(last=False)
        self._prepared.move_to_end(case)
        return self._prepared[case]

    def timing_inputs(self, case: AttentionCase) -> PreparedCase | InputsOnly:
        """What timing needs (a verified backend, or a check that only times): the prepared case if still
        held, else its inputs alone (the same seeded tensors), kept for the next few lookups; the reference
        is not recomputed to time."""
        if case in self._prepared:
            return self._prepared[case]
        if case not in self._inputs:
            self._inputs[case] = InputsOnly(case, self.device, make_inputs(case, self.device, self.seed))
            while len(self._inputs) > 2:
                self._inputs.popitem(last=False)
        return self._inputs[case]

    @property
    def round_timing(self) -> TimingConfig:
        """One round's share of the timing budget: all rounds together cost about what one round would."""
        t, r = self.timing, self.rounds
        min_reps = ceil(t.min_reps / r)
        return replace(t, warmup_ms=t.warmup_ms / r, budget_ms=t.budget_ms / r, min_reps=min_reps,
                       max_reps=max(min_reps, ceil(t.max_reps / r)))

    def record(self, case: AttentionCase, backend: Backend, result: BackendResult) -> None:
        self.verdicts[(case.id, backend.name)] = result
        self.writer.write(result.rows)

    def verdict(self, case: AttentionCase, backend: Backend) -> BackendResult:
        """The correctness result of this session, computed (and recorded) now if the suite did not run it."""
        key = (case.id, backend.name)
        if key not in self.verdicts:
            self.record(case, backend, execute(backend, self.prepared(case), self.run_id))
        return self.verdicts[key]

    def record_perf(self, result, round_index: int = 0) -> None:
        """Append the row (latency pooled over the rounds so far) and this round's raw samples, labelled
        with `round_index`. A key once flagged suspicious (faster than the matmul roofline) stays flagged,
        with that round's reason: the results file folds rows, so a later row could not clear the reason."""
        row = result.row
        key = (row["case_id"], row["backend"], row["phase"])
        before = self.perf_rows.get(key)
        if before is not None and before.get("suspicious") and row.get("status") == "pass" \
                and not row.get("suspicious"):
            row.update(suspicious=True, reason=before.get("reason", ""))
        self.writer.write([row])
        if result.measurement is not None:
            self.samples.write(self.run_id, *key, result.measurement.samples_ms, round_index=round_index)
            self.round_samples.setdefault(key, []).append(result.measurement.samples_ms)
            self.round_memory.setdefault(key, (row["peak_mem_bytes"], row["mem_method"]))
        self.perf_rows[key] = row

    def measure_peaks(self, dtypes) -> None:
        from harness.flops import measure_peaks
        self.peaks = measure_peaks(self.device, dtypes)
        self.env["matmul_peak_tflops"] = self.peaks
        self.env["timing_config"] = vars(self.timing) if hasattr(self.timing, "__dict__") else str(self.timing)
        self.save_env()
