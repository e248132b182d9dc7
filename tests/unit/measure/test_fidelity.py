"""The timing-fidelity figure on synthetic blocks from a drifting, bursty machine (seeded; no real timing): the
median of paired block ratios sees the timers, not the machine's moments."""

import numpy as np
import pytest

from harness.measure.fidelity import Fidelity
from harness.measure.measurement import Measurement


def _fidelity(seed: int, offset: float = 1.0, burst_blocks=(), blocks: int = 30, calls: int = 10) -> Fidelity:
    """Blocks of `calls` samples per timer; the machine's speed wanders 1-1.7x from block to block (both timers in
    a block see the same moment); the harness reads `offset` x the independent timer; in `burst_blocks` the
    harness's half of the block ran 3x slow."""
    rng = np.random.default_rng(seed)
    speed = np.exp(np.cumsum(rng.normal(0, 0.08, blocks)).clip(0, np.log(1.7)))
    pairs, parts = [], []
    for b in range(blocks):
        theirs = 2.0 * speed[b] * np.exp(np.abs(rng.normal(0, 0.03, calls)))
        ours = 2.0 * speed[b] * offset * np.exp(np.abs(rng.normal(0, 0.03, calls))) * (3.0 if b in burst_blocks else 1)
        pairs.append((tuple(ours), tuple(theirs)))
        parts.append(Measurement(tuple(ours), "cpu-clock", 1))
    return Fidelity(tuple(pairs), Measurement.merge(parts), "independent")


@pytest.mark.parametrize("seed", range(5))
def test_agreeing_timers_on_a_drifting_machine_agree_within_a_percent(seed):
    f = _fidelity(seed, burst_blocks=(3, 17))
    assert abs(f.ratio - 1) < 0.01 and not f.noisy and f.within
    assert "within +-3%" in f.describe() and "30 interleaved blocks" in f.describe()


def test_a_timer_reading_ten_percent_high_is_outside():
    f = _fidelity(1, offset=1.10)
    assert f.ratio == pytest.approx(1.10, abs=0.01) and not f.noisy and not f.within
    assert "OUTSIDE +-3%" in f.describe()


def test_a_machine_too_noisy_to_tell_says_so():
    f = _fidelity(2, burst_blocks=tuple(range(0, 30, 2)))  # half the blocks burst: the median cannot tell
    assert f.noisy and "too noisy to tell" in f.describe()
