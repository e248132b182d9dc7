"""A case id read back into the fields of its AttentionCase (`AttentionCase.from_id`): the grammar of its id, part by part.

dtype-bB-hH[kvK]-sQ[xK]-dD[vV]-MASK[+MASK...][-capC][-sink][-alibi][-headbias|-fullbias][-scaleS][-pageP]
[-fp8kv-G|-fp8qkv-G]. A long cache mask's digest (more than ID_LENGTHS sequences) is looked up among the known cases
(spec.case.CASE_SOURCES); any other case reads back from its `spelled_id`, which lists every length.
"""

from __future__ import annotations

import functools
import re
from typing import Callable

from harness.cases.masks import (And, CacheCausal, Causal, CausalBottomRight, Documents, KeyPadding, MaskSpec,
                                SlidingWindow)
from harness.cases.modifiers import BIAS_TOKENS

_INTS = r"\d+(?:_\d+)*"
_NUMBER = r"\d+(?:\.\d+)?(?:e[+-]\d+)?"
_SIDE = r"-1|\d+"


def _ints(text: str | None) -> tuple[int, ...] | None:
    return None if text is None else tuple(int(n) for n in text.split("_"))


#: the mask families, each a pattern and the spec its match builds; longer names first (causal-br before causal)
_MASKS: tuple[tuple[re.Pattern, Callable[[re.Match], MaskSpec | None]], ...] = tuple(
    (re.compile(pattern), build) for pattern, build in (
        (rf"cache-causal(\d+)x(\d+)to(\d+)(?:-q(\d+)to(\d+))?~([0-9a-f]{{8}})", lambda m: None),  # a digest
        (rf"cache-causal({_INTS})(?:-q({_INTS}))?", lambda m: CacheCausal(_ints(m[1]), _ints(m[2]))),
        (r"causal-br", lambda m: CausalBottomRight()),
        (rf"docs-causal({_INTS})(?:x({_INTS}))?", lambda m: Documents(_ints(m[1]), _ints(m[2]), causal=True)),
        (r"causal", lambda m: Causal()),
        (rf"docs({_INTS})(?:x({_INTS}))?", lambda m: Documents(_ints(m[1]), _ints(m[2]))),
        (rf"keypad({_INTS})", lambda m: KeyPadding(_ints(m[1]))),
        (rf"window({_SIDE})-({_SIDE})(?:-scaled-from(\d+))?",
         lambda m: SlidingWindow(int(m[1]), int(m[2]), scaled_from=None if m[3] is None else int(m[3]))),
    ))
MASK_FORMS = ("none, causal, causal-br, windowL-R[-scaled-fromN], keypadN_N.., docs[-causal]N_N..[xN_N..], "
              "cache-causalN_N..[-qN_N..]")
#: what may follow the mask, in the id's order: (name, pattern, the AttentionCase fields its match sets)
_TAIL: tuple[tuple[str, re.Pattern, Callable[[re.Match], dict]], ...] = tuple(
    (name, re.compile(pattern), fields) for name, pattern, fields in (
        ("softcap", rf"cap({_NUMBER})", lambda m: {"softcap": float(m[1])}),
        ("sinks", r"sink", lambda m: {"sinks": True}),
        ("alibi", r"alibi", lambda m: {"alibi": True}),
        ("bias", "|".join(BIAS_TOKENS.values()),
         lambda m: {"bias": next(k for k, token in BIAS_TOKENS.items() if token == m[0])}),
        ("scale", rf"scale({_NUMBER})", lambda m: {"scale": float(m[1])}),
        ("page size", r"page(\d+)", lambda m: {"page_size": int(m[1])}),
        ("fp8", r"fp8(qkv|kv)-(tensor|head)", lambda m: {"fp8_q": m[1] == "qkv", "fp8_kv": m[2]}),
    ))
_HEAD = (("dtype", r"(fp32|fp16|bf16|fp64)", "one of fp32, fp16, bf16, fp64"),
         ("batch", r"-b(\d+)", "-bN"), ("heads", r"-h(\d+)(?:kv(\d+))?", "-hN or -hNkvM"),
         ("sequence lengths", r"-s(\d+)(?:x(\d+))?", "-sN or -sNxM"), ("head dim", r"-d(\d+)(?:v(\d+))?",
                                                                       "-dN or -dNvM"))


class _Reader:
    """The id and a cursor; `fail` is the one-line error naming the part and where it goes wrong."""

    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def take(self, pattern: re.Pattern | str) -> re.Match | None:
        match = re.compile(pattern).match(self.text, self.pos)
        if match is not None:
            self.pos = match.end()
        return match

    def fail(self, part: str, expected: str) -> ValueError:
        rest = self.text[self.pos:] or "(end of id)"
        return ValueError(f"case id {self.text!r}: {part} at character {self.pos} ({rest[:24]!r}): expected {expected}")


def parse_case_id(text: str) -> tuple[dict, bool]:
    """(AttentionCase's keyword arguments, whether the mask is a digest) of the id `text` (module docstring); a
    one-line ValueError naming the part that is malformed otherwise."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"case id {text!r}: must be a non-empty string such as 'fp32-b2-h4-s64-d32-causal'")
    reader = _Reader(text)
    numbers = []
    for part, pattern, expected in _HEAD:
        match = reader.take(pattern)
        if match is None:
            raise reader.fail(part, expected)
        numbers.append(match.groups())
    (dtype,), (batch,), (heads, kv_heads), (seq_q, seq_k), (head_dim, head_dim_v) = numbers
    if reader.take("-") is None:
        raise reader.fail("mask", "'-' then a mask")
    mask, digest = _mask(reader)
    fields = dict(batch=int(batch), heads=int(heads), seq_q=int(seq_q), head_dim=int(head_dim), dtype=dtype,
                  kv_heads=None if kv_heads is None else int(kv_heads), seq_k=None if seq_k is None else int(seq_k),
                  mask=mask, head_dim_v=None if head_dim_v is None else int(head_dim_v))
    for name, pattern, to_fields in _TAIL:
        start = reader.pos
        if reader.take("-") is not None and (match := reader.take(pattern)) is not None:
            fields.update(to_fields(match))
        else:
            reader.pos = start
    if reader.pos != len(text):
        raise reader.fail("suffix", "modifiers (capC, sink, alibi, headbias/fullbias), scaleS, pageP, fp8kv-G or "
                                    "fp8qkv-G, in that order, or the end of the id")
    return fields, digest


def _mask(reader: _Reader) -> tuple[MaskSpec | None, bool]:
    """The mask at the cursor (parts joined by '+', intersected left to right), and whether it is a digest."""
    if reader.take(r"none(?=-|$)") is not None:
        return None, False
    parts, digest = [], False
    while True:
        for pattern, build in _MASKS:
            if (match := reader.take(pattern)) is not None:
                try:
                    part = build(match)
                except ValueError as exc:
                    raise reader.fail("mask", f"a valid mask ({exc})") from None
                digest = digest or part is None
                parts.append(part)
                break
        else:
            raise reader.fail("mask", MASK_FORMS + ", parts joined by '+'")
        if reader.take(r"\+") is None:
            break
    if reader.pos != len(reader.text) and reader.text[reader.pos] != "-":
        raise reader.fail("mask", MASK_FORMS + ", parts joined by '+'")
    return (None if digest else functools.reduce(And, parts)), digest
