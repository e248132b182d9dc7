"""What vLLM, SGLang and transformers would choose by their own rules (advisor/frameworks.py), the cases taken from
their released sources as docs/frameworks.md quotes them, and each backend's settings (backends/serving.py)."""

import importlib.util

import pytest

from harness.advisor.frameworks import CHOOSERS, Target, backend_running, sglang_choice, transformers_choice, \
    vllm_choice
from harness.backends.registry import all_backends
from harness.backends.serving import FRAMEWORKS, ServingKnob
from harness.cases.case import AttentionCase, paged_case

BF16 = AttentionCase(1, 8, 64, 128, "bf16")


def _sm(text: str, cuda: str = "12.8", flashinfer: bool = True) -> Target:
    target = Target.parse(text)
    return Target("cuda", target.capability, cuda, flashinfer)


# vllm/platforms/cuda.py of 0.13.0-0.18.0, _get_backend_priorities (non-MLA):
#     if device_capability.major == 10: return [FLASHINFER, FLASH_ATTN, TRITON_ATTN, FLEX_ATTENTION]
#     else: return [FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION]
# and fa_utils.get_flash_attn_version (0.17.0+): 3 on sm90, 4 on sm10x, else 2; ALiBi -> 2
@pytest.mark.parametrize("sm, case, value, backend", [
    ("sm90", BF16, "FLASH_ATTN (FlashAttention-3)", "flash-attn-3"),
    ("sm80", BF16, "FLASH_ATTN (FlashAttention-2)", "flash-attn"),
    ("sm100", BF16, "FLASHINFER", "flashinfer"),
    # FlashInfer takes head sizes 64, 128, 256 only: 96 falls to FLASH_ATTN, FlashAttention-4 on sm100
    ("sm100", AttentionCase(1, 8, 64, 96, "bf16"), "FLASH_ATTN (FlashAttention-4)", "flash-attn-4"),
    ("sm90", AttentionCase(1, 8, 64, 128, "bf16", alibi=True), "FLASH_ATTN (FlashAttention-2)", "flash-attn"),
    # sinks need FA3 (sm90): on sm80 FLASH_ATTN and FLASHINFER refuse them, TRITON_ATTN takes them
    ("sm80", AttentionCase(1, 8, 64, 128, "bf16", sinks=True), "TRITON_ATTN", None),
    ("sm90", AttentionCase(1, 8, 64, 128, "bf16", sinks=True), "FLASH_ATTN (FlashAttention-3)", "flash-attn-3"),
    # fp32: FLASH_ATTN and FLASHINFER take fp16/bf16 only
    ("sm90", AttentionCase(1, 8, 64, 128, "fp32"), "TRITON_ATTN", None),
    # head size 20: not a multiple of 8 (FLASH_ATTN), not 64/128/256 (FLASHINFER), under 32 (TRITON_ATTN)
    ("sm90", AttentionCase(1, 8, 64, 20, "bf16"), "FLEX_ATTENTION", "flex"),
    # a paged cache of 8-token blocks: FLASH_ATTN wants a multiple of 16, FLASHINFER 16/32/64
    ("sm90", paged_case(2, 8, 1, 128, "bf16", kv_heads=8, cache=64, page_size=8), "FLEX_ATTENTION", "flex"),
])
def test_vllm_takes_the_first_valid_backend_of_its_priority_list(sm, case, value, backend):
    choice = vllm_choice(_sm(sm), case)
    assert (choice.value, choice.backend) == (value, backend), choice.describe()


def test_vllm_names_what_it_passed_over_and_on_a_cpu_runs_its_own_kernels():
    choice = vllm_choice(_sm("sm80"), AttentionCase(1, 8, 64, 128, "bf16", sinks=True))
    assert choice.passed_over == ("FLASH_ATTN (sinks (FA3 or later))", "FLASHINFER (sinks (TRT-LLM kernels, sm100, "
                                                                       "only))")
    cpu = vllm_choice(Target("cpu"), BF16)
    assert cpu.value == "CPU_ATTN" and cpu.backend is None and "cpu.py" in cpu.rules


# arg_groups/model_override_base.py of SGLang 0.5.23, get_default_attn_backend (non-MLA)
@pytest.mark.parametrize("target, case, value, backend", [
    (_sm("sm90", cuda="12.4"), BF16, "fa3", "flash-attn-3"),
    (_sm("sm90", cuda="12.2"), BF16, "flashinfer", "flashinfer"),       # is_hopper_with_cuda_12_3 is false
    (_sm("sm100", cuda="12.8"), BF16, "trtllm_mha", None),             # FlashInfer's TRT-LLM kernels
    (_sm("sm100", cuda="12.8"), AttentionCase(1, 8, 64, 192, "bf16", head_dim_v=128), "fa4", "flash-attn-4"),
    (_sm("sm80"), BF16, "flashinfer", "flashinfer"),
    (_sm("sm80", flashinfer=False), BF16, "triton", None),
    (_sm("sm80"), AttentionCase(1, 8, 64, 128, "bf16", sinks=True), "triton", None),  # 0.5.11: no sinks in FlashInfer
    (Target("cpu"), BF16, "torch_native", "sdpa"),
    (Target("cpu", amx=True), BF16, "intel_amx", None),
])
def test_sglang_s_default_backend(target, case, value, backend):
    choice = sglang_choice(target, case)
    assert (choice.value, choice.backend) == (value, backend), choice.describe()


def test_transformers_defaults_to_sdpa_everywhere():
    for target in (Target("cpu"), _sm("sm90")):
        assert (transformers_choice(target, BF16).value, transformers_choice(target, BF16).backend) == ("sdpa", "sdpa")


def test_every_framework_has_its_rules_and_every_mapping_comes_from_a_backend_s_own_data():
    assert tuple(CHOOSERS) == FRAMEWORKS
    declared = {(k.framework, k.value) for b in all_backends().values() for k in b.serving}
    assert ("vllm", "FLASHINFER") in declared and ("sglang", "fa3") in declared
    assert backend_running("vllm", "FLASH_ATTN", ("--attention-config.flash_attn_version=3",)) == "flash-attn-3"
    assert backend_running("vllm", "TRITON_ATTN") is None


def test_a_setting_knows_the_releases_it_exists_in_and_what_to_paste():
    xformers = ServingKnob("vllm", "XFORMERS", "0.10.2", until="0.11.1")
    assert xformers.exists_in("0.11.1") and not xformers.exists_in("0.12.0") and not xformers.exists_in("0.10.1")
    fa4 = next(k for k in all_backends()["flash-attn-4"].serving if k.framework == "sglang")
    assert fa4.exists_in("0.5.3") and not fa4.exists_in("0.5.2")
    assert fa4.settings("decode") == ["--decode-attention-backend fa4   # SGLang >= 0.5.8"]
    assert fa4.settings("prefill") == ["--prefill-attention-backend fa4   # SGLang >= 0.5.3"]
    fa2 = next(k for k in all_backends()["flash-attn"].serving if k.framework == "vllm")
    new, old = fa2.settings()
    assert new.startswith("vllm serve MODEL --attention-backend FLASH_ATTN --attention-config.flash_attn_version=2")
    assert old.startswith("VLLM_ATTENTION_BACKEND=FLASH_ATTN VLLM_FLASH_ATTN_VERSION=2 vllm serve MODEL")
    assert xformers.settings() == ["VLLM_ATTENTION_BACKEND=XFORMERS vllm serve MODEL   # vLLM 0.10.2-0.11.1 (the "
                                   "variable is ignored from 0.15.0)"]
    assert ServingKnob("sglang", "triton", "0.4.9.post5").exists_in("0.4.10")
    assert not ServingKnob("sglang", "triton", "0.4.9.post5").exists_in("0.4.9.post4")
    with pytest.raises(ValueError, match="framework='tgi'; allowed: vllm, sglang, transformers"):
        ServingKnob("tgi", "x", "1.0")
    with pytest.raises(ValueError, match="expected dotted numbers"):
        ServingKnob("vllm", "X", "latest")


def test_a_target_reads_as_the_frameworks_name_compute_capabilities():
    assert Target.parse("sm90").capability == (9, 0) and Target.parse("sm100").capability == (10, 0)
    assert Target.parse("8.6").capability == (8, 6) and Target.parse("cpu").kind == "cpu"
    with pytest.raises(ValueError, match="--target 'h100': expected cpu, smXY"):
        Target.parse("h100")


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed here")
def test_transformers_values_exist_in_the_installed_release():  # pragma: no cover - not installed in CI
    from importlib.metadata import version

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    installed = version("transformers")
    valid = set(ALL_ATTENTION_FUNCTIONS.valid_keys()) | {"eager"}
    for backend in all_backends().values():
        for knob in backend.serving:
            if knob.framework == "transformers" and knob.exists_in(installed):
                assert knob.value in valid, (backend.name, knob.value, installed)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here")
def test_vllm_values_exist_in_the_installed_release():  # pragma: no cover - not installed in CI
    from importlib.metadata import version

    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    installed = version("vllm")
    for backend in all_backends().values():
        for knob in backend.serving:
            if knob.framework == "vllm" and knob.exists_in(installed):
                assert knob.value in AttentionBackendEnum.__members__, (backend.name, knob.value, installed)


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed here")
def test_sglang_values_exist_in_the_installed_release():  # pragma: no cover - not installed in CI
    from importlib.metadata import version

    from sglang.srt.server_args import ServerArgs
    import argparse
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    choices = next(a.choices for a in parser._actions if "--attention-backend" in a.option_strings)
    installed = version("sglang")
    for backend in all_backends().values():
        for knob in backend.serving:
            if knob.framework == "sglang" and knob.exists_in(installed):
                assert knob.value in choices, (backend.name, knob.value, installed)
