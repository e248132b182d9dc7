"""The one-line commands that rerun a failing row exactly: a (case, backend)'s check or a probe test, seed, device."""

from __future__ import annotations

import shlex
from typing import NamedTuple, Sequence

import torch

from harness.cases.case import AttentionCase


class RerunFlags(NamedTuple):
    """What a rerun needs besides the case, backend and seed: the plugin modules, then the device and the options
    that decide a verdict (a call's timeout, running without workers)."""

    modules: tuple[str, ...] = ()
    verdict: tuple[str, ...] = ()

    @classmethod
    def of(cls, backend_modules: Sequence[str], device: torch.device, *, isolate: bool = True,
           call_timeouts: Sequence[tuple[str, float]] = ()) -> "RerunFlags":
        timeouts = [f"--call-timeout-s {shlex.quote(f'{s:g}' if p == '*' else f'{p}={s:g}')}"
                    for p, s in call_timeouts]
        return cls(tuple(f"--backend-module {shlex.quote(m)}" for m in backend_modules),
                   (f"--device {device}", *timeouts, *(() if isolate else ("--no-isolate",))))


def repro_command(case: AttentionCase, backend: str, seed: int, flags: RerunFlags) -> str:
    """`python -m harness check --backend-module PATH --backends NAME --case 'ID' --seed S --device D`: the id
    spelled out (harness.cases.case_id reads it back, a long cache mask's too)."""
    return " ".join(["python -m harness check", *flags.modules, f"--backends {shlex.quote(backend)}",
                     f"--case '{case.spelled_id}'", f"--seed {seed}", *flags.verdict])


def probe_repro_command(test_id: str, backend: str, seed: int, matrix: str, flags: RerunFlags) -> str:
    """`python -m pytest 'suites/probes/test_X.py::test_y[ID]' --backends NAME --matrix M --seed S --device D`: reruns
    one probe test (its parametrization needs the backend and the matrix's tier), with this run's inputs."""
    return " ".join([f"python -m pytest {shlex.quote(test_id)}", *flags.modules, f"--backends {shlex.quote(backend)}",
                     f"--matrix {shlex.quote(matrix)}", f"--seed {seed}", *flags.verdict])
