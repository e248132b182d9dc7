"""The GPU acceptance run's plan (harness/cli/node/selftest_plan.py) judges the serving step and the FP8 caches on the next
GPU: its correctness and benchmark steps run gpu-smoke, which holds them, with every backend that loads there
(FlashAttention-4 included when installed)."""

from pathlib import Path

from harness.backends.registry import built_in_names
from harness.cli.node.selftest_plan import steps
from harness.cases.matrices import build_matrix


def test_gpu_smoke_steps_hold_the_serving_step_and_fp8_caches(tmp_path: Path):
    planned = {s.key: s for s in steps(False, tmp_path, 1, ["naive", "sdpa", "flex", "flash-attn-4", "flashinfer"])}
    for key in ("correctness", "benchmark"):
        command = planned[key].command
        assert command[command.index("--matrix") + 1] == "gpu-smoke" and "flash-attn-4,flashinfer" in ",".join(command)
    cases = build_matrix("gpu-smoke")
    steps_ = [c for c in cases if c.mask_kind == "cache-causal" and c.mask.mixed]
    assert {c.fp8_kv for c in steps_} == {None, "head"} and all(c.batch == 36 for c in steps_)
    assert {c.fp8_kv for c in cases if c.fp8_kv} == {"head"}
    assert {"flash-attn-3", "flash-attn-4", "flashinfer"} <= set(built_in_names())
