"""The fuzzing space: seeded, within a backend's declarations, edges mixed in, every draw a valid case or refused."""

from collections import Counter

import numpy as np
import torch

from harness.backends.naive import Naive
from harness.backends.base import Backend
from harness.fuzzing.space import MAX_SEQ, Space, build, draw, simpler_steps, size_of, with_size


def _draws(space, n=400, seed=0):
    rng = np.random.default_rng(seed)
    return [draw(rng, space) for _ in range(n)]


def test_the_same_seed_draws_the_same_knobs_and_another_seed_others():
    space = Space.of(Naive(), "cpu")
    assert _draws(space, 50, 3) == _draws(space, 50, 3) != _draws(space, 50, 4)


def test_draws_cover_the_wide_space_with_its_edges_and_stay_small_mostly():
    knobs = _draws(Space.of(Naive(), "cpu"), 600)
    cases = [build(k) for k in knobs]                       # naive declares everything: every draw is a case
    seqs = Counter(n for c in cases for n in (c.seq_q, c.seq_k))
    assert {1, 128, 129} <= set(seqs) and max(seqs) <= MAX_SEQ["cpu"]
    assert {80, 96, 72} & {c.head_dim for c in cases} and {c.head_dim % 8 for c in cases} > {0}
    assert {c.heads // c.kv_heads for c in cases} >= {1, 2, 3, 5, 7}
    assert {c.batch for c in cases} == set(range(1, 9))
    assert any(c.seq_q > c.seq_k for c in cases) and any(c.page_size for c in cases)
    assert any(c.mask is not None and "+" in c.mask_id for c in cases)
    assert any(c.mask is not None and c.mask.kind == "cache-causal" and c.mask.mixed for c in cases)
    assert any(c.modifiers for c in cases) and any(c.fp8_kv for c in cases)
    assert np.median([c.seq_q * c.seq_k for c in cases]) < 0.05 * MAX_SEQ["cpu"] ** 2   # weighted small


class Narrow(Backend):
    """Declares little: fp32, no GQA, head dims to 64, no modifiers, no paged, mixed or FP8 cases (not registered)."""

    name = "narrow"
    dtypes = (torch.float32,)
    supports_gqa = False
    max_head_dim = 64


def test_draws_stay_within_what_a_backend_declares():
    for k in _draws(Space.of(Narrow(), "cpu"), 300):
        case = build(k)
        assert case.dtype == torch.float32 and case.heads == case.kv_heads and case.head_dim <= 64
        assert not case.modifiers and case.page_size is None and case.fp8_kv is None
        assert case.mask is None or "cache-causal" not in case.mask_id


def test_simpler_steps_and_sizes_only_shrink():
    for k in _draws(Space.of(Naive(), "cpu"), 100, 7):
        for _, simpler in simpler_steps(k):
            assert simpler != k
        for name in ("seq_k", "cache", "window"):
            value = size_of(k, name)
            if value is not None and value > 1:
                assert size_of(with_size(k, name, 1), name) <= 1
