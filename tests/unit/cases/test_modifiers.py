"""The modifier fields of the case spec: validation (one line naming the value), the case id, judged gradients."""

import pytest

from harness import AttentionCase
from harness.cases.masks import Causal


@pytest.mark.parametrize("bad, message", [
    (dict(softcap=0), "softcap=0: must be a finite float > 0"),
    (dict(softcap=-1.0), "softcap=-1.0"),
    (dict(softcap=float("nan")), "softcap=nan"),
    (dict(softcap=True), "softcap=True"),
    (dict(bias="other"), "bias='other'; allowed: None, 'head', 'full'"),
    (dict(head_dim_v=0), "head_dim_v=0: must be an int >= 1"),
    (dict(sinks="yes"), "sinks='yes': must be True or False"),
    (dict(alibi=1), "alibi=1: must be True or False"),
])
def test_bad_modifiers_get_one_line(bad, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")) as info:
        AttentionCase(1, 2, 4, 8, "fp32", **bad)
    assert "\n" not in str(info.value)


def test_case_id_shows_the_modifiers():
    case = AttentionCase(1, 16, 512, 192, "bf16", head_dim_v=128, mask=Causal(), softcap=30, sinks=True)
    assert case.id == "bf16-b1-h16-s512-d192v128-causal-cap30-sink"
    assert AttentionCase(1, 2, 4, 8, "fp32", alibi=True, bias="head").id == "fp32-b1-h2-s4-d8-none-alibi-headbias"
    assert AttentionCase(1, 2, 4, 8, "fp32", bias="full").id.endswith("-fullbias")
    assert AttentionCase(1, 2, 4, 8, "fp32", head_dim_v=8).id == "fp32-b1-h2-s4-d8-none"  # the default dim


def test_modifiers_and_grads():
    case = AttentionCase(1, 2, 4, 8, "fp32", softcap=5.0, sinks=True, bias="full")
    assert case.modifiers == {"softcap", "sinks", "bias"} and case.modifier_id == "cap5-sink-fullbias"
    assert case.grads == ("dq", "dk", "dv", "dsinks", "dbias")
    plain = AttentionCase(1, 2, 4, 8, "fp32")
    assert plain.modifiers == frozenset() and plain.grads == ("dq", "dk", "dv") and plain.head_dim_v == 8
