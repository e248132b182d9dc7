"""harness.execution.isolation: a worker that cannot start is the harness's failure, not the backend's absence.

Seen on the first GPU runs (one H200, torch 2.11.0+cu130, 2026-11-30): torch.cuda.set_device raised on a bare
'cuda' (torch/cuda/_utils.py `_get_device_index(optional=False)`, torch 2.11-2.13), every worker of a
`--device cuda` run failed to start, and every row read 'unavailable'."""

import os
from pathlib import Path

import torch

from harness.backends.base import Backend
from harness.backends.naive import Naive
from harness.execution.isolation import IsolatedExecutor
from harness.execution.runner import refusal
from harness.spec.case import AttentionCase
from harness.store.schema import ERROR

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[3]


def test_a_worker_that_cannot_start_gives_an_error_row_not_unavailable(tmp_path):
    ghost = type("Ghost", (Backend,), {"name": "not-in-the-worker"})()  # registered here only: the worker refuses
    executor = IsolatedExecutor(CPU, modules=(), log_dir=str(tmp_path / "workers"))
    case = AttentionCase(1, 2, 8, 8, "fp32")
    try:
        status, reason = refusal(ghost, case, CPU, executor)
        assert status == ERROR
        assert "the worker of not-in-the-worker could not start" in reason and "not registered" in reason
        assert refusal(Naive(), case, CPU, executor) is None  # the other workers are unaffected
    finally:
        executor.close()


def _preloaded(backend, device, *modules):
    import sys

    return [m for m in modules if m in sys.modules]


PRELOADED = """
import torch
from harness.backends.naive import Naive
from harness.execution.isolation import PROFILER_PRELOAD, IsolatedExecutor
from tests.unit.execution.test_isolation import _preloaded
if __name__ == "__main__":
    executor = IsolatedExecutor(torch.device("cpu"), preload={preload})
    print(executor.run(Naive(), _preloaded, torch.device("cpu"), *PROFILER_PRELOAD))
    executor.close()
"""


def test_workers_start_with_what_the_forkserver_preloaded(tmp_path):
    """A timed CPU run's workers find torch._inductor imported once by the forkserver, not by each worker's first
    profile (1.5-1.9 s of CPU each, torch 2.13: torch.profiler's prepare_trace reaches it through torch.__getattr__);
    without the preload the worker had none (checked once by hand: '[]'). A fresh process: a process starts its
    forkserver once, so this test process's forkserver may already run with another list."""
    import subprocess
    import sys

    script = tmp_path / "preloaded.py"
    script.write_text(PRELOADED.format(preload="PROFILER_PRELOAD"))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "['torch._inductor']"
