"""A check and a recommendation from Python (issue 47, item 2) leave the caller's process as they found it: functorch's
donated_buffer, dynamo's recompile limits and fail_on_recompile_limit_hit, the thread count, no atexit entry per
call, no stage clock accumulating; an in-process run says it is unguarded (harness.calls.caller)."""

import atexit

import torch
import torch._functorch.config as functorch_config
from torch._dynamo import config as dynamo_config

import harness
from harness.backends.flex import DYNAMO_SETTINGS, raise_recompile_limits
from harness.backends.naive import Naive
from harness.isolation.in_process import UNGUARDED
from harness.measure.stages import STAGE_CLOCK
from harness.measure.timing import TimingConfig
from harness.cases.case import AttentionCase

CASE = AttentionCase(1, 2, 16, 8, "fp32")


class Meddling(Naive):
    """The user's own kernel, in their process: it changes dynamo's limits and the thread count when called."""

    name = "meddling-in-process"

    def forward(self, q, k, v, *, mask, scale):
        raise_recompile_limits()
        torch.set_num_threads(1)
        return super().forward(q, k, v, mask=mask, scale=scale)


def _state() -> dict:
    return {"donated_buffer": functorch_config.donated_buffer, "threads": torch.get_num_threads(),
            "atexit": atexit._ncallbacks(), "clock": STAGE_CLOCK.snapshot(),
            **{name: getattr(dynamo_config, name) for name in DYNAMO_SETTINGS if hasattr(dynamo_config, name)}}


def test_check_and_recommend_leave_the_callers_process_as_they_found_it(torch_setting):
    torch_setting(functorch_config, "donated_buffer", True)  # the caller's own choices, unlike the harness's
    torch_setting(dynamo_config, "recompile_limit", 7)
    torch_setting(dynamo_config, "fail_on_recompile_limit_hit", False)
    torch.set_num_threads(max(2, torch.get_num_threads()))

    def recommend() -> None:
        harness.recommend.recommend(1, 2, 16, 8, dtype="fp32", backends=["naive"], device="cpu", checks=False,
                                    timing=TimingConfig(warmup_ms=1, budget_ms=5, min_reps=3, max_reps=5))

    first = _state()
    recommend()  # what a module registers at exit as recommend first imports it is once a process, not a call's
    before = _state()
    assert {k: v for k, v in before.items() if k != "atexit"} == {k: v for k, v in first.items() if k != "atexit"}
    for _ in range(2):  # per call: nothing accumulates
        df = harness.check([Meddling(), "naive"], [CASE], "cpu")
        assert set(df.status) == {"pass"} and df.attrs["integrity"] == UNGUARDED
        assert _state() == before
    recommend()
    assert _state() == before
