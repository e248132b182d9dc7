"""The traffic mix (advisor/mix.py, advisor/advice.py): the overall pick minimises the weighted attention time, the
per-part picks (prefill, decode) are made apart, the margin has a bootstrap interval, and a framework's setting is
the fastest measured backend it can run - on seeded synthetic samples, so no machine's load moves a verdict."""

import numpy as np
import pandas as pd
import pytest

from harness.advisor.advice import framework_advice
from harness.advisor.frameworks import Target
from harness.advisor.mix import compare, traffic_mix, weighted
from harness.advisor.ranking import Recommendation
from harness.advisor.workload import Workload, load_workloads

PREFILL = Workload(1, 4, 256, 32, dtype="fp32", name="prefill")
DECODE = Workload(8, 4, 1, 32, seq_k=512, dtype="fp32", mask="causal-br", name="decode")


def _rec(medians: dict[str, float], seed: int) -> Recommendation:
    """A workload's ranking with 40 lognormal samples per backend around `medians` (ms), 5 % spread."""
    rng = np.random.default_rng(seed)
    samples = {b: tuple(m * np.exp(rng.normal(0, 0.05, 40))) for b, m in medians.items()}
    table = pd.DataFrame({"backend": list(medians), "status": "pass", "rank": range(1, len(medians) + 1)})
    return Recommendation(table, min(medians, key=medians.get), "", samples=samples)


#: sdpa twice as fast on prefill, flex twice as fast on decode
RECS = {"prefill": _rec({"sdpa": 1.0, "flex": 2.0}, 1), "decode": _rec({"sdpa": 0.2, "flex": 0.1}, 2)}


@pytest.mark.parametrize("prefill_weight, decode_weight, winner", [(1, 1, "sdpa"), (1, 100, "flex"), (100, 1, "sdpa")])
def test_the_weights_decide_the_overall_pick(prefill_weight, decode_weight, winner):
    """sdpa's time: w_p x 1.0 + w_d x 0.2; flex's: w_p x 2.0 + w_d x 0.1 - equal weights favour sdpa (1.2 against
    2.1), a decode-heavy mix flex (21 against 12)."""
    workloads = [PREFILL.__class__(**{**PREFILL.__dict__, "weight": prefill_weight}),
                 DECODE.__class__(**{**DECODE.__dict__, "weight": decode_weight})]
    mix = traffic_mix(workloads, RECS)
    assert mix.overall.winner == winner
    assert mix.parts["prefill"].winner == "sdpa" and mix.parts["decode"].winner == "flex" and mix.split
    expected = prefill_weight * 2.0 + decode_weight * 0.1 if winner == "sdpa" else prefill_weight + decode_weight * 0.2
    best = min(prefill_weight + decode_weight * 0.2, prefill_weight * 2.0 + decode_weight * 0.1)
    assert mix.overall.ratio == pytest.approx(expected / best, rel=0.05)
    assert mix.overall.ratio_low <= mix.overall.ratio <= mix.overall.ratio_high
    assert mix.overall.runner_up_ahead < 0.05


def test_tokens_per_second_weigh_by_calls_and_a_tie_shows_in_the_interval():
    # 256 prefill tokens a call, 8 decode tokens a call: 2560 and 80 tokens/s are 10 calls/s each
    workloads = [Workload(**{**PREFILL.__dict__, "tokens_per_s": 2560.0}),
                 Workload(**{**DECODE.__dict__, "tokens_per_s": 80.0})]
    assert [w.calls_weight for w in workloads] == [10.0, 10.0] and weighted(workloads)
    tied = {"prefill": _rec({"sdpa": 1.0, "flex": 1.0}, 3), "decode": _rec({"sdpa": 0.1, "flex": 0.1}, 4)}
    pick = traffic_mix(workloads, tied).overall
    assert pick.ratio_low < 1.0 < pick.ratio_high and 0.05 < pick.runner_up_ahead < 0.95


def test_a_backend_not_ranked_on_every_shape_is_left_out_of_the_overall_pick_with_why():
    recs = {"prefill": RECS["prefill"], "decode": _rec({"sdpa": 0.2}, 5)}
    recs["decode"].table.loc[len(recs["decode"].table)] = {"backend": "flex", "status": "unsupported", "rank": None}
    mix = traffic_mix([PREFILL, DECODE], recs)
    assert mix.overall.winner == "sdpa" and mix.overall.excluded == {"flex": "not ranked on decode (unsupported)"}
    assert np.isnan(compare("sdpa", "flex", [PREFILL, DECODE], recs)[0])


def test_sglang_gets_a_setting_per_part_where_they_differ_and_vllm_one_for_all():
    workloads = [Workload(**{**PREFILL.__dict__, "weight": 1}), Workload(**{**DECODE.__dict__, "weight": 100})]
    mix = traffic_mix(workloads, RECS)
    sglang = framework_advice("sglang", Target("cpu"), workloads, RECS, mix)
    assert sglang.parts == {"prefill": "sdpa", "decode": "flex"}
    assert sglang.settings == ("--prefill-attention-backend torch_native   # SGLang >= 0.4.9.post5",
                               "--decode-attention-backend flex_attention   # SGLang >= 0.5.3")
    vllm = framework_advice("vllm", Target("cpu"), workloads, RECS, mix)
    assert vllm.pick == "flex" and vllm.settings[0].startswith("vllm serve MODEL --attention-backend FLEX_ATTENTION")
    # on sm80 bf16 it would choose FLASH_ATTN (FlashAttention-2), not measured here
    tf = framework_advice("transformers", Target("cpu"), workloads, RECS, mix)
    assert tf.choice.backend == "sdpa" and tf.pick == "flex"
    assert tf.versus.startswith("flex measured 1.")  and "faster than sdpa (sdpa) on this mix" in tf.versus


def test_the_workload_file_takes_weights_tokens_and_parts(tmp_path):
    path = tmp_path / "mix.toml"
    path.write_text('[defaults]\npreset = "llama-3-8b"\n\n[[shape]]\nname = "chunk"\nbatch = 1\nseq = 512\n'
                    'weight = 3\n\n[[shape]]\nname = "decode"\nbatch = 64\nseq_q = 1\nseq_k = 4096\n'
                    'tokens_per_s = 6400\npart = "decode"\n')
    chunk, decode = load_workloads(path)
    assert (chunk.weight, chunk.role) == (3, "prefill") and (decode.calls_weight, decode.role) == (100.0, "decode")
    for bad, words in [('weight = -1', "weight=-1: must be a positive number"),
                       ('weight = 1\ntokens_per_s = 5', "give one of the two"),
                       ('part = "train"', "part='train'; allowed: prefill, decode, mixed, training")]:
        path.write_text(f'[[shape]]\nbatch = 1\nheads = 4\nhead_dim = 32\nseq = 64\n{bad}\n')
        with pytest.raises(ValueError, match=words):
            load_workloads(path)
