"""The workload file's format as docs/timing.md documents it (issue 35: it was written nowhere but in an error
message): the doc's example loads, and a shape may name a model `preset`."""

import re
from pathlib import Path

import pytest

from harness.advisor.workload import load_workloads
from harness.cases.serving_step import StepMix, parse_mix, serving_step

DOC = Path(__file__).resolve().parents[3] / "docs" / "timing.md"


def _doc_toml() -> str:
    blocks = re.findall(r"```toml\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1, "docs/timing.md holds one workload file example"
    return blocks[0]


def test_the_documented_workload_example_loads(tmp_path):
    path = tmp_path / "model.toml"
    path.write_text(_doc_toml())
    prefill, decode, step = load_workloads(path)
    assert prefill.label == "prefill" and prefill.case().id == "bf16-b1-h32kv8-s4096-d128-causal"
    assert decode.label == "decode" and decode.case().id == "bf16-b32-h32kv8-s1x4096-d128-none"
    assert not prefill.training and not decode.training
    # the traffic mix (issue 66): a share of the calls, or tokens a second at 32 tokens a call
    assert (prefill.calls_weight, prefill.role) == (1.0, "prefill") and (decode.calls_weight, decode.role) == (100.0,
                                                                                                              "decode")
    assert step.role == "mixed"
    # llama-3-8b: 32 heads, 8 kv heads, head dim 128; the mix's 36 sequences over caches of up to 4096 keys
    assert step.label == "serving step" and step.serving_step == "p1x512-d31-v4x4" and not step.training
    assert step.case() == serving_step(32, 128, "bf16", kv_heads=8, cache=4096, page_size=16,
                                       mix=parse_mix("p1x512-d31-v4x4"))


def _load(tmp_path, text):
    path = tmp_path / "w.toml"
    path.write_text(text)
    return load_workloads(path)


def test_a_preset_shape_takes_the_models_layer_kinds_and_modifiers(tmp_path):
    local, global_ = _load(tmp_path, '[[shape]]\npreset = "gemma-2-9b"\nbatch = 2\nseq = 256\ntraining = true')
    assert local.softcap == global_.softcap == 50.0 and local.training and local.heads == 16
    assert "window" in local.mask and global_.mask == "causal" and local.label != global_.label


@pytest.mark.parametrize("text, message", [
    ('[[shape]]\npreset = "llama-9"\nbatch = 1\nseq = 64', "unknown preset 'llama-9'; allowed"),
    ('[[shape]]\npreset = "llama-3-8b"\nbatch = 1\nseq = 64\nheads = 8', "sets heads, kv heads, head dim, mask and "
                                                                         "modifiers; drop heads"),
    ('[[shape]]\npreset = "llama-3-8b"\nbatch = 1', "needs batch and seq (or seq_q/seq_k); missing seq"),
])
def test_a_bad_preset_shape_names_the_bad_value(tmp_path, text, message):
    with pytest.raises(ValueError, match="w.toml shape 1") as info:
        _load(tmp_path, text)
    assert message in str(info.value)


def test_a_serving_step_shape_takes_its_batch_and_queries_from_the_mix(tmp_path):
    """`serving_step = true` is the default mix; [defaults] batch and mask (for the other shapes) do not apply to it."""
    (w,) = _load(tmp_path, '[defaults]\nbatch = 8\nmask = "none"\n\n[[shape]]\nserving_step = true\nheads = 8\n'
                           'kv_heads = 2\nhead_dim = 64\nseq = 2048\npage_size = 16')
    mix = StepMix()
    assert (w.batch, w.seq_q, w.serving_step, w.label) == (mix.batch, 512, mix.id, f"step {mix.id} s2048")
    assert w.case() == serving_step(8, 64, "bf16", kv_heads=2, cache=2048, page_size=16, mix=mix)


STEP = '[[shape]]\nheads = 8\nhead_dim = 64\nseq = 256\n'


@pytest.mark.parametrize("text, message", [
    (STEP + "serving_step = 3", "serving_step=3: must be a mix id pPxC-dD-vVxS such as 'p1x512-d31-v4x4', or true"),
    (STEP + 'serving_step = "p1-d2"', "serving step 'p1-d2': must read pPxC-dD-vVxS"),
    (STEP + 'serving_step = "p1x24-d5-v2x4"\nbatch = 8', "sets the batch, the query lengths and the mask (the "
                                                          "caches' causal); drop batch"),
    (STEP + 'serving_step = "p1x24-d5-v2x4"\nmask = "none"', "drop mask"),
    (STEP + 'serving_step = "p1x24-d5-v2x4"\ntraining = true', "serving step p1x24-d5-v2x4 is forward only; got "
                                                                "training=True"),
    (STEP + 'serving_step = "p1x24-d5-v2x4"\nsoftcap = 5.0', "serving step p1x24-d5-v2x4: takes no modifiers yet"),
    ('[[shape]]\nheads = 8\nhead_dim = 64\nserving_step = true', "needs heads, head_dim and seq (the longest "
                                                                   "cache; or seq_k); missing seq"),
    ('[[shape]]\npreset = "llama-3-8b"\nserving_step = true', "needs seq (the longest cache)"),
    ('[[shape]]\npreset = "llama-3-8b"\nserving_step = true\nseq = 64\nheads = 4', "drop heads"),
])
def test_a_bad_serving_step_shape_is_one_line_naming_the_value(tmp_path, text, message):
    with pytest.raises(ValueError, match="w.toml shape 1") as info:
        _load(tmp_path, text)
    assert message in str(info.value) and "\n" not in str(info.value)
