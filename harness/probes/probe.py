"""A semantics question's probe (who is asked, where, with which inputs) and its answer, shared by every question."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from harness.backends.base import Backend
from harness.execution.cache import LRU, cached
from harness.execution.call import Call
from harness.execution.executor import Executor, make_executor
from harness.execution.runner import prepare_case
from harness.oracle.prepared import PreparedCase
from harness.oracle.verdict import Check
from harness.probes.common import refused
from harness.spec.case import AttentionCase, Inputs


@dataclass(frozen=True)
class Probe:
    """Who is asked (backend), where (device), with which inputs (seed), where its calls run (executor), and
    where runs shared by several questions are kept (the run's probe cache; None: each question runs its own)."""

    backend: Backend
    device: torch.device
    seed: int = 0
    executor: Executor = field(default_factory=make_executor)
    cache: LRU | None = None

    def cached(self, key: tuple, make: Callable):
        return cached(self.cache, key, make)

    def prepared(self, case: AttentionCase) -> PreparedCase:
        return self.cached(("prepared", case, str(self.device), self.seed),
                           lambda: prepare_case(case, self.device, self.seed))

    def call(self, case: AttentionCase, inputs: Inputs, **call) -> tuple[torch.Tensor | None, str]:
        """(output in canonical layout, or None; why not) of one call on given inputs, without gradients."""
        answer = self.executor.call(self.backend, Call(case, None, inputs, **call), self.device)
        if answer.failure is not None:
            return None, answer.failure.reason
        return answer.out, ""


@dataclass
class Answer:
    """A question's answer for one backend: status observed/unsupported/unavailable, the value, why."""

    status: str
    observed: str = ""
    reason: str = ""
    checks: list[Check] = field(default_factory=list)


def skip(probe: Probe, case: AttentionCase) -> Answer | None:
    """The answer when `probe`'s backend cannot run `case` here (unavailable or unsupported), else None."""
    gate = refused(probe.backend, case, probe.device, probe.executor)
    return Answer(gate[0], "", gate[1]) if gate else None
