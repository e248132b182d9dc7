"""Flex must not fall back to unfused eager attention after ~128 shapes without anyone knowing.

torch 2.13 dynamo (torch/_dynamo/config.py 121-147): recompile_limit 8 per code object and
accumulated_recompile_limit 256 over all its graphs; past either, convert_frame.py (1986-2040) logs one line and
runs the function eagerly, unless fail_on_recompile_limit_hit raises instead."""

import torch

from harness.backends import flex


def test_flex_raises_both_limits_and_fails_loudly_if_hit_once_a_case():
    """In `prepare`, outside the timed calls: a check from Python puts them back when it returns, so every case's
    prepare sets them again (the compiled function is built once per process)."""
    from harness.spec.case import AttentionCase

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
