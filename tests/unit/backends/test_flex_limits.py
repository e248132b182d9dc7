"""Flex must not fall back to unfused eager attention after ~128 shapes without anyone knowing.

torch 2.13 dynamo (torch/_dynamo/config.py 121-147): recompile_limit 8 per code object and
accumulated_recompile_limit 256 over all its graphs; past either, convert_frame.py (1986-2040) logs one line and
runs the function eagerly, unless fail_on_recompile_limit_hit raises instead. And a compiled graph must be the one
for the CPU capability the process dispatches."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.backends import flex


def test_flex_raises_both_limits_and_fails_loudly_if_hit_once_a_case():
    """In `prepare`, outside the timed calls: a check from Python puts them back when it returns, so every case's
    prepare sets them again (the compiled function is built once per process)."""
    from harness.cases.case import AttentionCase

    flex.Flex().prepare(AttentionCase(1, 2, 8, 8, "fp32"), torch.device("cpu"))
    config = torch._dynamo.config
    assert config.recompile_limit >= 100_000 and config.accumulated_recompile_limit >= 100_000
    assert config.fail_on_recompile_limit_hit is True


def test_hitting_a_limit_is_an_error_not_a_silent_eager_run():
    """With the flag set, dynamo raises where it would have run the function eagerly."""
    config = torch._dynamo.config
    before = (config.recompile_limit, config.accumulated_recompile_limit, config.fail_on_recompile_limit_hit)
    calls = []

    @torch.compile(backend="eager", dynamic=False)
    def f(x):
        calls.append(1)
        return x * 2

    try:
        config.recompile_limit, config.fail_on_recompile_limit_hit = 1, True
        torch._dynamo.reset()
        f(torch.ones(2))
        raised = None
        try:
            f(torch.ones(3))  # a second shape: a second graph, over the limit of one
        except Exception as exc:
            raised = exc
        assert raised is not None and "recompile" in str(raised).lower()
    finally:
        config.recompile_limit, config.accumulated_recompile_limit, config.fail_on_recompile_limit_hit = before
        torch._dynamo.reset()


_ONE_CASE = """
import torch
from harness.backends.flex import Flex
from harness.backends.naive import Naive
from harness.cases.case import AttentionCase
from harness.cases.masks import Causal
torch.manual_seed(0)
q, k, v = (torch.randn(1, 2, 40, 64) for _ in range(3))
flex, ref = Flex(), Naive()
flex.prepare(AttentionCase(1, 2, 40, 64, "fp32", mask=Causal()), torch.device("cpu"))
out = flex.forward(q, k, v, mask=Causal(), scale=0.125)
print(float((out - ref.forward(q, k, v, mask=Causal(), scale=0.125)).abs().max()))
"""


def test_a_graph_compiled_for_one_cpu_capability_is_not_served_to_another(tmp_path):
    """torch 2.13's FX graph cache keys a graph on inductor's config, not on ATEN_CPU_CAPABILITY, which picks its
    vector width: AVX-512 code served to a process dispatching AVX2 gave errors of 1-5 and segfaults (issue 67
    item 9). Two processes, one shared fresh cache: the wider first, then AVX2."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip(f"needs a CPU dispatching AVX512 (this one: {torch.backends.cpu.get_cpu_capability()})")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    for capability in ("avx512", "avx2"):
        done = subprocess.run([sys.executable, "-c", _ONE_CASE], capture_output=True, text=True, timeout=600,
                              env={**env, "ATEN_CPU_CAPABILITY": capability}, cwd=Path(__file__).parents[3])
        assert done.returncode == 0, (capability, done.stderr[-2000:])
        assert float(done.stdout.split()[-1]) < 1e-4, (capability, done.stdout)
