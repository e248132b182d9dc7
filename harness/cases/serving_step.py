"""The mixed serving step: prefill chunks, decodes, then verifications in one batch (CacheCausal(lengths, q_lens))."""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.cases.case import AttentionCase, parse_dtype
from harness.cases.masks import CacheCausal
from harness.cases.modifiers import validate_int
from harness.cases.masks.cache_causal import cache_lengths


@dataclass(frozen=True)
class StepMix:
    """A step's `prefills` chunks of `chunk` tokens, `decodes` single tokens, `verifications` of `spec_len` tokens."""

    prefills: int = 1
    chunk: int = 512
    decodes: int = 31
    verifications: int = 4
    spec_len: int = 4

    def __post_init__(self):
        for name, least in (("prefills", 0), ("chunk", 1), ("decodes", 0), ("verifications", 0), ("spec_len", 1)):
            validate_int(name, getattr(self, name), least)
        if self.batch == 0:
            raise ValueError("StepMix(prefills=0, decodes=0, verifications=0): a step needs at least one sequence")

    @property
    def batch(self) -> int:
        return self.prefills + self.decodes + self.verifications

    @property
    def q_lens(self) -> tuple[int, ...]:
        return (self.chunk,) * self.prefills + (1,) * self.decodes + (self.spec_len,) * self.verifications

    @property
    def id(self) -> str:
        """'p1x512-d31-v4x4'."""
        return f"p{self.prefills}x{self.chunk}-d{self.decodes}-v{self.verifications}x{self.spec_len}"


#: StepMix.id's form, which parse_mix reads back
MIX_PATTERN = re.compile(r"p(\d+)x(\d+)-d(\d+)-v(\d+)x(\d+)")


def parse_mix(text: str) -> StepMix:
    """'p1x512-d31-v4x4' (StepMix.id's form) -> its StepMix."""
    match = MIX_PATTERN.fullmatch(str(text))
    if match is None:
        raise ValueError(f"serving step {text!r}: must read pPxC-dD-vVxS (P prefill chunks of C tokens, D decodes, V "
                         f"verifications of S tokens), e.g. {StepMix().id}")
    return StepMix(*map(int, match.groups()))                                # pPxC-dD-vVxS: StepMix's field order


#: a mix the CPU matrices run in seconds: one 24-token chunk, 5 decodes, 2 verifications of 4
CPU_MIX = StepMix(prefills=1, chunk=24, decodes=5, verifications=2, spec_len=4)


def serving_step(heads: int, head_dim: int, dtype, *, kv_heads: int, cache: int, page_size: int | None,
                 mix: StepMix = StepMix()) -> AttentionCase:
    """The mixed step `mix` over caches of about `cache` keys, paged in pages of `page_size` (None: contiguous)."""
    q_lens = mix.q_lens
    # each cache raised where needed to hold its own queries: q | 1 is odd and >= q
    lengths = tuple(max(n, q | 1) for n, q in zip(cache_lengths(validate_int("cache", cache), mix.batch), q_lens))
    return AttentionCase(mix.batch, heads, max(q_lens), head_dim, parse_dtype(dtype), kv_heads=kv_heads,
                         seq_k=max(lengths), mask=CacheCausal(lengths, q_lens), page_size=page_size)
