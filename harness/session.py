"""A run: its id and directory, the results writer, the environment, and what earlier stages found."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.backends.base import Backend
from harness.case import AttentionCase
from harness.env import environment, new_run_id
from harness.results import ResultsWriter
from harness.runner import BackendResult, PreparedCase, prepare_case


@dataclass
class RunSession:
    device: torch.device
    results_root: Path
    seed: int = 0
    run_id: str = field(default_factory=new_run_id)
    #: (case id, backend name) -> the correctness result, so later stages time only what passed
    verdicts: dict = field(default_factory=dict)
    _prepared: OrderedDict = field(default_factory=OrderedDict)

    def __post_init__(self):
        self.run_dir = Path(self.results_root) / self.run_id
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.writer = ResultsWriter(self.run_dir / "results.csv")
        self.env = environment(self.device)
        self.env["run_id"] = self.run_id
        self.save_env()

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

    def record(self, case: AttentionCase, backend: Backend, result: BackendResult) -> None:
        self.verdicts[(case.id, backend.name)] = result
        self.writer.write(result.rows)
