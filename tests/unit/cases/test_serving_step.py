"""The mixed serving step: CacheCausal with per-sequence query lengths (its semantics, intervals, id and one-line
errors) and the step mixes the matrices and presets build."""

import pytest
import torch

from harness import AttentionCase
from harness.cases.masks import CacheCausal, count_attended_pairs
from harness.cases.serving_step import CPU_MIX, StepMix, serving_step


def test_each_sequence_aligns_its_own_queries_to_its_own_cache():
    """Query i of sequence b sees keys j <= lengths[b] - q_lens[b] + i; rows i >= q_lens[b] see nothing."""
    lengths, q_lens = (10, 6, 8), (4, 1, 2)
    dense = CacheCausal(lengths, q_lens).materialize(4, 10, batch=3)[:, 0]
    for b, (n, q) in enumerate(zip(lengths, q_lens)):
        for i in range(4):
            seen = dense[b, i].nonzero().flatten().tolist()
            assert seen == (list(range(n - q + i + 1)) if i < q else []), (b, i)
    # without q_lens every sequence has seq_q queries: the decode sequence would lose 3 keys
    uniform = CacheCausal(lengths).materialize(4, 10, batch=3)[:, 0]
    assert uniform[1, 0].sum() == 3 and dense[1, 0].sum() == 6


def test_intervals_and_pair_counts_are_the_mask():
    mask = CacheCausal((9, 5, 7, 3), (3, 1, 2, 3))
    lo, hi = mask.key_ranges(3, 9, 4)
    dense = mask.materialize(3, 9, batch=4)[:, 0]
    k = torch.arange(9).view(1, 1, -1)
    assert torch.equal((k >= lo[..., None]) & (k < hi[..., None]), dense)
    assert count_attended_pairs(mask, 4, 3, 9) == int(dense.sum()) == (7 + 8 + 9) + 5 + (6 + 7) + (1 + 2 + 3)


def test_ids_carry_the_query_lengths():
    case = AttentionCase(3, 4, 4, 32, "fp32", kv_heads=2, seq_k=45, mask=CacheCausal((45, 20, 33), (4, 1, 2)),
                         page_size=16)
    assert case.id == "fp32-b3-h4kv2-s4x45-d32-cache-causal45_20_33-q4_1_2-page16"
    long, other = CacheCausal(tuple(range(100, 136)), (1,) * 36), CacheCausal(tuple(range(100, 136)), (2,) * 36)
    assert long.id.startswith("cache-causal36x100to135-q1to1~") and long.id != other.id and len(long.id) < 50
    assert CacheCausal((45, 20)).id == "cache-causal45_20"                     # without q_lens: as before


@pytest.mark.parametrize("build, match", [
    (lambda: CacheCausal((10, 6), (4,)), r"CacheCausal.q_lens=\(4,\): must be one int >= 1 per sequence \(2"),
    (lambda: CacheCausal((10, 6), (4, 0)), r"q_lens=\(4, 0\): must be one int >= 1"),
    (lambda: CacheCausal((10, 6), (4, 7)), r"q_lens\[1\]=7 > lengths\[1\]=6 \(the queries are the last entries"),
    (lambda: AttentionCase(2, 4, 5, 32, "fp32", seq_k=10, mask=CacheCausal((10, 6), (4, 1))),
     r"seq_q=5: a mixed step's seq_q is its longest query run, max\(CacheCausal.q_lens\)=4"),
    (lambda: StepMix(prefills=0, decodes=0, verifications=0), "a step needs at least one sequence"),
    (lambda: StepMix(chunk=0), "chunk=0: must be an int >= 1"),
    (lambda: serving_step(8, 64, "fp32", kv_heads=2, cache=0, page_size=None), "cache=0: must be an int >= 1"),
])
def test_bad_steps_get_one_line_errors(build, match):
    with pytest.raises(ValueError, match=match) as err:
        build()
    assert "\n" not in str(err.value)


def test_the_default_mix_is_the_issue_step_and_every_cache_holds_its_queries():
    mix = StepMix()
    assert mix.batch == 36 and sum(mix.q_lens) == 512 + 31 + 16 and mix.id == "p1x512-d31-v4x4"
    case = serving_step(32, 128, "bf16", kv_heads=8, cache=4096, page_size=16)
    assert case.seq_q == 512 and case.seq_k == 4095 and case.page_size == 16
    assert all(n >= q and n % 2 for n, q in zip(case.mask.lengths, case.mask.q_lens))
    small = serving_step(8, 64, "fp32", kv_heads=2, cache=20, page_size=None, mix=CPU_MIX)
    assert small.mask.lengths[0] == 25 and small.seq_k == 25                  # raised to hold the 24-token chunk
