"""docs/serving.md's mixed-step plugin (`# my_step.py`), run as a user would: loaded from its own file, judged on a
mixed serving step and on a plain verification step, refused nothing."""

import re
from pathlib import Path

import pytest

import harness
from harness import AttentionCase
from harness.isolation.plugin_host import load_backend_module
from harness.cases.masks import CacheCausal

DOC = Path(__file__).resolve().parents[3] / "docs" / "serving.md"


@pytest.fixture(scope="module")
def my_step(tmp_path_factory):
    block = next(b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
                 if b.startswith("# my_step.py"))
    path = tmp_path_factory.mktemp("plugin") / "my_step.py"
    path.write_text(block)
    load_backend_module(str(path))
    return "my-step"


def test_the_docs_plugin_passes_a_mixed_step_and_a_verification(my_step):
    cases = [AttentionCase(4, 4, 12, 32, "bf16", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33, 27), (12, 1, 4, 1)),
                           page_size=16),
             AttentionCase(3, 4, 4, 32, "fp32", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16)]
    df = harness.check([my_step], cases, "cpu")
    assert list(df[df.phase == "fwd"].status) == ["pass", "pass"], df[["case_id", "status", "reason"]]


def test_the_docs_case_id_is_what_the_spec_gives():
    case = AttentionCase(4, 32, 12, 128, "bf16", kv_heads=8, seq_k=45,
                         mask=CacheCausal((45, 20, 33, 27), q_lens=(12, 1, 4, 1)), page_size=16)
    assert f"case.id   # '{case.id}'" in DOC.read_text()


def test_the_docs_fp8_case_id_is_what_the_spec_gives():
    case = AttentionCase(3, 32, 4, 128, "bf16", kv_heads=8, seq_k=45, mask=CacheCausal((45, 20, 33)), page_size=16,
                         fp8_kv="head")
    assert f"case.id   # '{case.id}'" in DOC.read_text()
