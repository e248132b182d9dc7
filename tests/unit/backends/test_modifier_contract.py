"""The modifier contract: undeclared modifiers never reach forward (an unsupported row with the reason), declared
ones arrive as keyword arguments of the documented types, and their gradients are judged."""

import torch

import harness
from harness import AttentionCase, Backend
from harness.backends.naive import Naive
from harness.cases.masks import Causal

CALLS: list = []


class PlainPlugin(Backend):
    """A user's plugin written before modifiers existed: forward(q, k, v, *, mask, scale)."""

    name = "plain-plugin"

    def forward(self, q, k, v, *, mask, scale):
        CALLS.append("plain")
        return Naive().forward(q, k, v, mask=mask, scale=scale)


class SinkPlugin(Backend):
    """Declares sinks only, and checks what it is given."""

    name = "sink-plugin"
    modifiers = frozenset({"sinks"})

    def forward(self, q, k, v, *, mask, scale, sinks=None):
        CALLS.append(("sinks", sinks.shape, sinks.dtype, sinks.requires_grad))
        return Naive().forward(q, k, v, mask=mask, scale=scale, sinks=sinks)


def test_undeclared_modifiers_and_head_dim_v_are_unsupported_rows_not_calls():
    CALLS.clear()
    cases = [AttentionCase(1, 2, 16, 8, "fp32", sinks=True), AttentionCase(1, 2, 16, 8, "fp32", head_dim_v=4),
             AttentionCase(1, 2, 16, 8, "fp32", softcap=5.0, sinks=True)]
    df = harness.check([PlainPlugin(), SinkPlugin()], cases, "cpu")
    plain = df[df.backend == "plain-plugin"]
    assert set(plain.status) == {"unsupported"} and "plain" not in CALLS
    assert plain.reason.iloc[0] == "plain-plugin does not take the sinks modifier: not declared in its `modifiers`"
    assert "head_dim_v 4 != head_dim 8" in plain.reason.iloc[2]
    sink = df[df.backend == "sink-plugin"].set_index(["case_id", "phase"]).status
    assert sink.loc[(cases[0].id, "fwd")] == sink.loc[(cases[0].id, "bwd")] == "pass"
    assert sink.loc[(cases[2].id, "fwd")] == "unsupported"                   # softcap not declared
    assert ("sinks", (2,), torch.float32, True) in CALLS


def test_declared_modifiers_arrive_as_documented_and_their_gradients_are_judged():
    seen = {}

    class Recorder(Naive):
        name = "recorder"

        def forward(self, q, k, v, **kwargs):
            seen.update({k_: v_ for k_, v_ in kwargs.items() if k_ in ("softcap", "sinks", "alibi_slopes", "bias")})
            return super().forward(q, k, v, **kwargs)

    case = AttentionCase(2, 4, 16, 8, "bf16", softcap=10.0, sinks=True, alibi=True, bias="head", mask=Causal())
    df = harness.check([Recorder()], [case], "cpu").set_index("phase")
    assert seen["softcap"] == 10.0
    assert seen["alibi_slopes"].dtype == torch.float32 and seen["alibi_slopes"].shape == (4,)
    assert seen["sinks"].dtype == torch.bfloat16 and seen["sinks"].requires_grad
    assert seen["bias"].shape == (1, 4, 16, 16) and seen["bias"].requires_grad
    assert set(df.status) == {"pass"}
    bwd = df.loc["bwd"]
    assert bwd.dsinks_err <= bwd.dsinks_tol and bwd.dbias_err <= bwd.dbias_tol and bwd.naive_dbias_err > 0
    assert df.loc["fwd"].modifiers == "cap10-sink-alibi-headbias" and "forward keywords" in df.loc["fwd"].modifier_path


def test_the_documented_plugin_example_runs_and_is_judged():
    """docs/variants.md's plugin example, executed as written: it passes with a softcap, refuses sinks with its
    reason."""
    import re
    from pathlib import Path

    from harness.backends import registry

    text = (Path(__file__).resolve().parents[3] / "docs" / "variants.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/variants.md", "exec"), namespace)
    try:
        plugin = namespace["MyGemmaKernel"]()
        cases = [AttentionCase(1, 2, 16, 8, "fp32", mask=Causal(), softcap=5.0),
                 AttentionCase(1, 2, 16, 8, "fp32", sinks=True)]
        df = harness.check([plugin], cases, "cpu").set_index(["case_id", "phase"])
        assert df.loc[(cases[0].id, "fwd"), "status"] == df.loc[(cases[0].id, "bwd"), "status"] == "pass"
        assert df.loc[(cases[1].id, "fwd"), "reason"] == ("my-gemma-kernel does not take the sinks modifier: "
                                                          "my kernel has no sink term")
    finally:
        registry._REGISTRY.pop("my-gemma-kernel", None)  # registered by the example: not left for other tests


def test_timed_training_step_computes_the_modifier_gradients_too(monkeypatch):
    from harness.calls import round as timed_round
    from harness.cases.case import make_inputs

    made = []
    real = timed_round.modifier_leaves
    monkeypatch.setattr(timed_round, "modifier_leaves", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    case = AttentionCase(1, 2, 16, 8, "fp32", sinks=True, bias="full")
    phase = timed_round.TimedRound(Naive(), case, "fwd+bwd", torch.device("cpu"), make_inputs(case))
    phase.setup()
    phase.call()
    assert set(made[0]) == {"sinks", "bias"}
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in made[0].values())
    phase.setup()  # reset clears them for the next repetition
    assert all(t.grad is None for t in made[0].values())
