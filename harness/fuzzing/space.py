"""The fuzzing space: seeded random cases over a wide geometry, drawn within a backend's declarations, weighted toward
small sizes with the edges (1, a tile boundary, one past it) mixed in on purpose; and the steps that make one simpler.

A drawn case is a `Knobs` record (plain numbers and names) that `build` turns into an AttentionCase; the shrinker
changes knobs, never a case, so every smaller case is rebuilt the same valid way (docs/fuzzing.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import numpy as np

from harness.cases.case import AttentionCase, dtype_name
from harness.cases.masks import And, CacheCausal, Causal, CausalBottomRight, Documents, KeyPadding, SlidingWindow

#: the sizes at which kernels split work (tiles, blocks, warps' rows): each is drawn as itself, one below, one past
TILES = (16, 32, 64, 128, 256, 512, 1024)
#: the head dims kernels specialize on; the draw adds one below and one past each, and the models' 72, 80, 96
HEAD_DIMS = (8, 16, 32, 64, 72, 80, 96, 128, 160, 192, 256)
MAX_BATCH, MAX_GROUP, MAX_KV_HEADS, MAX_HEAD_DIM = 8, 8, 4, 256
#: the longest sequence drawn per device type: about 2k keys on a CPU, where the float64 reference is the cost
MAX_SEQ = {"cpu": 2048, "cuda": 16384}
#: the mask parts a drawn mask is made of (a structural part, key padding, or both intersected)
STRUCTURES = ("causal", "causal-br", "window", "docs", "docs-causal")
#: dense: a contiguous K/V; cache: a KV cache whose queries are its last entries (paged when page_size is set);
#: mixed: a mixed serving step (per-sequence query lengths)
LAYOUTS = ("dense", "cache", "mixed")
#: how often the draw takes an edge size rather than a log-uniform one
EDGE_SHARE = 0.4
#: the models' head dims that are no tile's multiple, and the GQA groups that are no power of two: kernels tiled for
#: 64/128 and groups of 2^n break there, so the draw takes them on purpose this often (the rest stays 1/n-weighted,
#: small first)
ODD_HEAD_DIMS, ODD_GROUPS, ODD_SHARE = (72, 80, 96), (3, 5, 6, 7), 0.5


@dataclass(frozen=True)
class Knobs:
    """One drawn case before it is built: every choice, as numbers and names (tuples hold MAX_BATCH entries, of
    which the first `batch` are used)."""

    dtype: str
    batch: int
    kv_heads: int
    group: int
    seq_q: int
    seq_k: int
    head_dim: int
    head_dim_v: int | None = None
    layout: str = "dense"
    structure: str | None = None
    padded: bool = False
    window: tuple[int, int] = (0, 0)
    #: key lengths of a padded mask (clipped to seq_k)
    pad: tuple[int, ...] = ()
    #: document cut points, per mille of each sequence
    cuts: tuple[int, ...] = ()
    #: cache lengths (cache/mixed layouts; each raised to hold its queries) and a mixed step's query counts
    cache: tuple[int, ...] = ()
    q_lens: tuple[int, ...] = ()
    page_size: int | None = None
    softcap: float | None = None
    sinks: bool = False
    alibi: bool = False
    bias: str | None = None
    fp8_kv: str | None = None
    fp8_q: bool = False


def _documents(cuts: tuple[int, ...], seq: int) -> tuple[int, ...]:
    points = sorted(min(seq, c * seq // 1000) for c in cuts)
    bounds = [0, *points, seq]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


def build(k: Knobs) -> AttentionCase:
    """The AttentionCase of `k` (a ValueError when the knobs make no valid case)."""
    heads = k.kv_heads * k.group
    common = dict(kv_heads=k.kv_heads, fp8_kv=k.fp8_kv, fp8_q=k.fp8_q, softcap=k.softcap, sinks=k.sinks,
                  alibi=k.alibi, bias=k.bias, head_dim_v=k.head_dim_v)
    if k.layout != "dense":
        q_lens = k.q_lens[:k.batch] if k.layout == "mixed" else (k.seq_q,) * k.batch
        lengths = tuple(max(c, q) for c, q in zip(k.cache, q_lens))
        mask = CacheCausal(lengths, q_lens if k.layout == "mixed" else None)
        return AttentionCase(k.batch, heads, max(q_lens), k.head_dim, k.dtype, seq_k=max(lengths), mask=mask,
                             page_size=k.page_size, **common)
    parts = []
    if k.structure in ("causal", "causal-br"):
        parts.append(Causal() if k.structure == "causal" else CausalBottomRight())
    elif k.structure == "window":
        parts.append(SlidingWindow(*k.window))
    elif k.structure in ("docs", "docs-causal"):
        parts.append(Documents(_documents(k.cuts, k.seq_q), _documents(k.cuts, k.seq_k),
                               causal=k.structure == "docs-causal"))
    if k.padded:
        parts.append(KeyPadding(tuple(min(n, k.seq_k) for n in k.pad[:k.batch])))
    mask = parts[0] if len(parts) == 1 else And(*parts) if parts else None
    return AttentionCase(k.batch, heads, k.seq_q, k.head_dim, k.dtype, seq_k=k.seq_k, mask=mask, **common)


@dataclass(frozen=True)
class Space:
    """What one backend declares it takes (its class data), which the draw stays within."""

    dtypes: tuple[str, ...]
    max_head_dim: int
    gqa: bool
    modifiers: frozenset[str]
    head_dim_v: bool
    paged: bool
    page_multiple: int
    mixed: bool
    fp8_kv: bool
    fp8_q: bool
    max_seq: int

    @classmethod
    def of(cls, backend, device_type: str) -> "Space":
        dtypes = tuple(dtype_name(d) for d in backend.dtypes) if backend.dtypes else ("fp32", "bf16", "fp16")
        return cls(tuple(d for d in dtypes if d != "fp64") or dtypes, min(backend.max_head_dim or MAX_HEAD_DIM,
                                                                          MAX_HEAD_DIM),
                   backend.supports_gqa, frozenset(backend.modifiers), backend.supports_head_dim_v,
                   backend.paged_kv, backend.page_size_multiple, backend.mixed_batch, backend.fp8_kv, backend.fp8_q,
                   MAX_SEQ.get(device_type, MAX_SEQ["cuda"]))


def _size(rng: np.random.Generator, hi: int, lo: int = 1) -> int:
    """An integer in [lo, hi]: an edge (lo, a tile, one below or past it, hi) or log-uniform, so small sizes lead."""
    if rng.random() < EDGE_SHARE:
        edges = [n for t in TILES for n in (t - 1, t, t + 1) if lo <= n <= hi] + [lo, hi]
        return int(rng.choice(edges))
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)) - 1e-9))) if hi > lo else lo


def _small(rng: np.random.Generator, hi: int) -> int:
    """1..hi with weight 1/n: a batch, a GQA group, a kv head count."""
    weights = 1.0 / np.arange(1, hi + 1)
    return int(rng.choice(np.arange(1, hi + 1), p=weights / weights.sum()))


def _odd(rng: np.random.Generator, odd: tuple[int, ...], hi: int) -> int | None:
    """One of `odd` (those up to hi) ODD_SHARE of the time, else None: the caller draws as usual."""
    within = [n for n in odd if n <= hi]
    return int(rng.choice(within)) if within and rng.random() < ODD_SHARE else None


def _group(rng: np.random.Generator) -> int:
    odd = _odd(rng, ODD_GROUPS, MAX_GROUP)
    return odd if odd is not None else _small(rng, MAX_GROUP)


def _head_dim(rng: np.random.Generator, hi: int) -> int:
    if (odd := _odd(rng, ODD_HEAD_DIMS, hi)) is not None:
        return odd
    roll = rng.random()
    if roll < 0.5:
        edges = [n for d in HEAD_DIMS for n in (d - 1, d, d + 1) if 8 <= n <= hi] or [hi]
        return int(rng.choice(edges))
    return int(8 * rng.integers(1, hi // 8 + 1)) if roll < 0.75 else int(rng.integers(8, hi + 1))


def draw(rng: np.random.Generator, space: Space) -> Knobs:
    """One case's knobs within `space` (build may still refuse them: the caller draws again)."""
    dtype = str(rng.choice(space.dtypes))
    batch, kv_heads = _small(rng, MAX_BATCH), _small(rng, MAX_KV_HEADS)
    group = _group(rng) if space.gqa else 1
    head_dim = _head_dim(rng, space.max_head_dim)
    layouts = ["dense"] + ["cache"] * space.paged + ["mixed"] * space.mixed
    layout = str(rng.choice(layouts, p=[0.7] + [0.3 / (len(layouts) - 1)] * (len(layouts) - 1))
                 if len(layouts) > 1 else "dense")
    seq_q, seq_k = _size(rng, space.max_seq), _size(rng, space.max_seq)
    knobs = Knobs(dtype, batch, kv_heads, group, seq_q, seq_k, head_dim)
    fp8 = space.fp8_kv and dtype != "fp64" and rng.random() < 0.15
    if layout != "dense":
        page = _size(rng, 64) if rng.random() < 0.8 else None
        if page is not None and page % space.page_multiple:
            page = space.page_multiple * max(1, round(page / space.page_multiple))
        q_hi = 8 if layout == "cache" else 64
        q_lens = tuple(_size(rng, q_hi) if layout == "mixed" and rng.random() < 0.5 else
                       int(rng.integers(1, 5)) for _ in range(MAX_BATCH))
        seq_q = _size(rng, q_hi)
        # a one-key last page on purpose now and then: a length of a multiple of the page plus one
        cache = tuple(int((rng.integers(0, 8) * page + 1) if page and rng.random() < 0.3 else _size(rng,
                                                                                                    space.max_seq))
                      for _ in range(MAX_BATCH))
        knobs = replace(knobs, layout=layout, seq_q=seq_q, cache=cache, q_lens=q_lens, page_size=page)
    else:
        roll = rng.random()
        structure = None if roll < 0.3 else str(rng.choice(STRUCTURES))
        padded = rng.random() < 0.3
        left = int(rng.choice([0, 1, _size(rng, 64), seq_k + _size(rng, 64), -1]))   # -1: unbounded; or wider
        right = int(rng.choice([0, 0, 0, 1, _size(rng, 64), -1]))
        pad = tuple(int(rng.choice([0, seq_k, int(rng.integers(0, seq_k + 1))])) for _ in range(MAX_BATCH))
        cuts = tuple(int(c) for c in rng.integers(0, 1001, size=int(rng.integers(1, 5))))
        knobs = replace(knobs, structure=structure, padded=padded, window=(left, right), pad=pad, cuts=cuts)
        if not fp8:
            mods = space.modifiers
            knobs = replace(knobs, softcap=float(rng.choice([5.0, 20.0, 50.0])) if "softcap" in mods
                            and rng.random() < 0.15 else None, sinks="sinks" in mods and rng.random() < 0.15,
                            alibi="alibi" in mods and rng.random() < 0.15,
                            bias=str(rng.choice(["head", "full"])) if "bias" in mods and rng.random() < 0.15
                            else None,
                            head_dim_v=_head_dim(rng, MAX_HEAD_DIM) if space.head_dim_v and rng.random() < 0.15
                            else None)
    if fp8:
        fp8_q = space.fp8_q and rng.random() < 0.4
        knobs = replace(knobs, fp8_kv=str(rng.choice(["tensor", "head"])), fp8_q=fp8_q,
                        dtype="bf16" if fp8_q else knobs.dtype)
    return knobs


#: the shrinker's steps, in the order it tries them: what it removes, then the sizes it lowers (binary search from 1)
SIMPLER: tuple[tuple[str, Callable[[Knobs], Knobs]], ...] = (
    ("fp32", lambda k: replace(k, dtype="fp32") if not k.fp8_q else k),
    ("no fp8 queries", lambda k: replace(k, fp8_q=False)),
    ("no fp8 cache", lambda k: replace(k, fp8_kv=None, fp8_q=False)),
    ("no softcap", lambda k: replace(k, softcap=None)),
    ("no sinks", lambda k: replace(k, sinks=False)),
    ("no alibi", lambda k: replace(k, alibi=False)),
    ("no bias", lambda k: replace(k, bias=None)),
    ("head_dim_v = head_dim", lambda k: replace(k, head_dim_v=None)),
    ("no mask", lambda k: replace(k, structure=None, padded=False)),
    ("no padding", lambda k: replace(k, padded=False)),
    ("padding alone", lambda k: replace(k, structure=None)),
    ("causal for the window", lambda k: replace(k, structure="causal") if k.structure == "window" else k),
    ("one document", lambda k: replace(k, cuts=()) if k.structure in ("docs", "docs-causal") else k),
    ("a decode/verification step", lambda k: replace(k, layout="cache", seq_q=min(k.q_lens[:k.batch]))
     if k.layout == "mixed" else k),
    ("contiguous cache", lambda k: replace(k, page_size=None)),
)
#: sizes, each lowered by a binary search between 1 and its value; tuples lowered entry by entry to a cap
#: (the longest first: a trial at half a long sequence costs a quarter of one at its length)
SIZES = ("seq_k", "seq_q", "cache", "q_lens", "batch", "group", "kv_heads", "head_dim", "head_dim_v", "page_size",
         "window")


def with_size(k: Knobs, name: str, value: int) -> Knobs:
    """`k` with size `name` at `value` (a tuple's entries capped at it)."""
    current = getattr(k, name)
    if isinstance(current, tuple):
        return replace(k, **{name: tuple(min(n, value) if n >= 0 else n for n in current)})
    return replace(k, **{name: value})


def size_of(k: Knobs, name: str) -> int | None:
    """The value a binary search lowers: a size, or a tuple's largest entry (among those in use); None: not set."""
    current = getattr(k, name)
    if isinstance(current, tuple):
        used = current[:k.batch] if name in ("cache", "q_lens", "pad") else current
        return max(used, default=None)
    return current


def simpler_steps(k: Knobs) -> Iterator[tuple[str, Knobs]]:
    """Each removal of SIMPLER that changes `k`, in order."""
    for name, step in SIMPLER:
        candidate = step(k)
        if candidate != k:
            yield name, candidate


def toward(k: Knobs, smallest: Knobs, steps: tuple[str, ...]) -> Knobs:
    """`k` moved to where another failure shrank: its removals (`steps`) applied and each size lowered to
    `smallest`'s, but not below 2 (a size at 1 stays): a drawn case that still fails there most likely fails the
    same way (one trial, not a shrink), while one whose own trigger is a single row, head or group does not move
    onto another failure's single row."""
    for name, step in SIMPLER:
        if name in steps:
            k = step(k)
    for name in SIZES:
        value, least = size_of(k, name), size_of(smallest, name)
        if value is not None and least is not None and max(least, 2) < value:
            k = with_size(k, name, max(least, 2))
    return k

