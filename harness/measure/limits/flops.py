"""FLOP counts of attention from the exact number of (query, key) pairs each mask lets attend."""

from __future__ import annotations

from harness.cases.case import AttentionCase
from harness.cases.masks import count_attended_pairs
from harness.store.schema import BWD, FWD, FWD_BWD, PHASES

#: backward does 2.5x the forward's matmul work (dS, dP, dQ, dK, dV against S and O in the forward)
BACKWARD_FACTOR = 2.5
PHASE_FACTOR = {FWD: 1.0, BWD: BACKWARD_FACTOR, FWD_BWD: 1.0 + BACKWARD_FACTOR}


def attention_flops(case: AttentionCase, phase: str) -> int:
    """2*pairs*(D_qk + D_v) over the attended (query, key) pairs of all heads; modifiers not counted."""
    if phase not in PHASES:
        raise ValueError(f"phase={phase!r}; allowed: {', '.join(PHASES)}")
    pairs = count_attended_pairs(case.mask, case.batch, case.seq_q, case.seq_k) * case.heads
    forward = 2 * pairs * case.head_dim + 2 * pairs * case.head_dim_v
    return int(forward * PHASE_FACTOR[phase])
