"""harness.calls.caller.allow_backward_replay: every process that runs backends lets a compiled backward run
again on its graph (the bwd phase replays it with retain_graph=True).

AOTAutograd's donated buffers (torch/_functorch/_aot_autograd/runtime_wrappers.py, torch 2.11-2.13) refuse that
backward: on an H200 (torch 2.11.0+cu130, 2026-11-30) every flex bwd timing row was an error."""

import torch

from harness.backends.naive import Naive
from harness.isolation.supervisor import IsolatedExecutor
from harness.run.runner import refusal
from harness.run.session import RunSession
from harness.cases.case import AttentionCase

CPU = torch.device("cpu")


def test_sessions_and_workers_turn_donated_buffers_off_before_any_backend_runs(tmp_path, torch_setting):
    import torch._functorch.config as functorch_config

    torch_setting(functorch_config, "donated_buffer", True)
    RunSession(CPU, tmp_path)
    assert functorch_config.donated_buffer is False
    torch_setting(functorch_config, "donated_buffer", True)
    seen = tmp_path / "seen.txt"
    probe = tmp_path / "donation_probe.py"  # a plugin module the worker loads after its setup: it reports the flag
    probe.write_text("import torch._functorch.config as c\n"
                     f"open({str(seen)!r}, 'w').write(str(c.donated_buffer))\n")
    executor = IsolatedExecutor(CPU, modules=(str(probe),), log_dir=str(tmp_path / "workers"))
    try:
        assert refusal(Naive(), AttentionCase(1, 2, 8, 8, "fp32"), CPU, executor) is None
    finally:
        executor.close()
    assert seen.read_text() == "False"
