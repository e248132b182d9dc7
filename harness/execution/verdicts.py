"""What correctness found in a run, per (case, backend): later stages time and summarize only from it."""

from __future__ import annotations

from typing import ItemsView

from harness.backends.base import Backend
from harness.execution.outcome import BackendResult
from harness.spec.case import AttentionCase


class VerdictMemory:
    """The correctness verdict of each (case id, backend name) judged in the run, without its tensors."""

    def __init__(self):
        self._verdicts: dict[tuple[str, str], BackendResult] = {}

    def remember(self, case: AttentionCase, backend: Backend, result: BackendResult) -> None:
        self._verdicts[(case.id, backend.name)] = result.released()

    def get(self, case: AttentionCase, backend: Backend) -> BackendResult | None:
        return self._verdicts.get((case.id, backend.name))

    def items(self) -> ItemsView[tuple[str, str], BackendResult]:
        return self._verdicts.items()

    def __len__(self) -> int:
        return len(self._verdicts)
