"""The workload file's format as docs/timing.md documents it (issue 35: it was written nowhere but in an error
message): the doc's example loads, and a shape may name a model `preset`."""

import re
from pathlib import Path

import pytest

from harness.advisor.workload import load_workloads

DOC = Path(__file__).resolve().parents[3] / "docs" / "timing.md"


def _doc_toml() -> str:
    blocks = re.findall(r"```toml\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1, "docs/timing.md holds one workload file example"
    return blocks[0]


def test_the_documented_workload_example_loads(tmp_path):
    path = tmp_path / "model.toml"
    path.write_text(_doc_toml())
    prefill, decode = load_workloads(path)
    assert prefill.label == "prefill" and prefill.case().id == "bf16-b1-h32kv8-s4096-d128-causal"
    assert decode.label == "decode" and decode.case().id == "bf16-b32-h32kv8-s1x4096-d128-none"
    assert not prefill.training and not decode.training


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
