"""The correctness rule: err(backend) <= factor * err(naive, same dtype) + floor(dtype) * max(1, max|ref|, terms).

err is the max absolute difference from the float64 reference; NaN/inf where the reference is finite always fails;
naive itself is held to NAIVE_BOUND[dtype] * max(1, max|ref|, terms). terms: for dq and dk, the size of the terms
they sum before the softmax backward cancels them (Reference.terms_of), so a gradient that cancels to ~0 is held to
the rounding of what it summed. Why this rule: docs/design/backends.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.store.schema import JUDGED_QUANTITIES

#: each judged quantity's factor, from the one table of judged quantities
FACTORS = {q.name: q.factor for q in JUDGED_QUANTITIES}
FLOORS = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}
NAIVE_BOUND = {torch.float64: 1e-8, torch.float32: 1e-3, torch.float16: 5e-2, torch.bfloat16: 2.5e-1}


@dataclass(frozen=True)
class Check:
    """One quantity's comparison: measured error, the tolerance applied, and whether it passed."""

    quantity: str
    err: float
    tol: float
    naive_err: float | None
    nonfinite: bool
    #: how `tol` was formed, in figures (so a failure message defines its own numbers)
    rule: str = ""
    #: max |ref| of the reference compared with (0 when empty)
    largest: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.nonfinite and self.err <= self.tol

    @property
    def ratio(self) -> float:
        """err / tol: how close this is to failing (1.0 = on the line)."""
        if self.nonfinite:
            return math.inf
        return self.err / self.tol if self.tol > 0 else (0.0 if self.err == 0 else math.inf)

    def describe(self) -> str:
        if self.nonfinite:
            return f"{self.quantity} has NaN/inf where the reference is finite"
        # err and tol defined where they are read: err's formula, tol's figures
        rule = f" = {self.rule}" if self.rule else ""
        return f"{self.quantity} err max|{self.quantity} - ref| = {self.err:.3g} > tol {self.tol:.3g}{rule}"


#: a floating element's bits as the integer type of its size
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """`t`'s elements as same-size integers (a floating tensor; any other as it is), a view: compared bit for bit."""
    t = t.detach()
    return t.view(_BITS[t.element_size()]) if t.element_size() in _BITS and t.is_floating_point() else t


#: elements compared at a time on a CPU: one chunk's float64 temporaries (2 MiB each) stay in cache, so a comparison
#: reads memory once (a gpu-smoke output: 0.06-0.10 s against 1.3-1.4 s whole-tensor; docs/measurements.md)
CHUNK = 1 << 18
#: on a GPU: large enough that each chunk's kernels fill the device, small enough that the float64 scratch (128 MiB)
#: fits beside any case the reference fits
DEVICE_CHUNK = 1 << 24


def compare(actual: torch.Tensor, ref: torch.Tensor, factor: float = 1.0,
            ref_largest: float | None = None) -> tuple[float, bool, float]:
    """(max |actual - factor * ref| over finite entries, whether actual has NaN/inf where ref is finite,
    max |factor * ref|), in one chunked pass where the reference lives (the answer is brought to it: on a GPU run
    the verdict is computed on the device, oracle.placement). factor: a signed power of two, so factor * ref is exact
    and never made. ref_largest: max |ref| when known (a reference judged against many answers), not read again."""
    if math.frexp(factor)[0] not in (0.5, -0.5):
        raise ValueError(f"compare factor {factor!r} is not a signed power of two (exact scaling is)")
    actual = actual.detach()
    if actual.shape != ref.shape:
        raise ValueError(f"output shape {tuple(actual.shape)} != reference shape {tuple(ref.shape)}")
    if actual.numel() == 0:
        return 0.0, False, float("nan")
    ref = ref.detach()
    actual = actual.to(ref.device, non_blocking=ref.device.type == "cuda")
    chunks = _host_chunks if ref.device.type == "cpu" else _device_chunks
    worst, nonfinite, largest = chunks(actual, ref, factor, ref_largest is None)
    # one read of the figures at the end: on a GPU, the only synchronisation of a comparison
    ref_largest = float(largest) if ref_largest is None else ref_largest
    return float(worst), bool(nonfinite), abs(factor) * ref_largest


def _pairs(actual: torch.Tensor, ref: torch.Tensor, chunk: int):
    n = actual.numel()
    if n <= chunk:  # one chunk, in its own shape: a transposed layout's gradient is not copied to be flattened
        return [(actual, ref)]
    flat_actual, flat_ref = actual.reshape(-1), ref.reshape(-1)
    return ((flat_actual[s:s + chunk], flat_ref[s:s + chunk]) for s in range(0, n, chunk))


def _largest_of(r: torch.Tensor) -> torch.Tensor:
    low, high = torch.aminmax(r)
    return torch.maximum(-low, high)


def _host_chunks(actual: torch.Tensor, ref: torch.Tensor, factor: float, want_largest: bool):
    """compare's figures on a CPU, as 0-d tensors: only a chunk whose difference is not finite pays for finiteness
    masks (bad entries zeroed, NaN propagated, as the whole-tensor formula)."""
    # one float64 scratch, worked on in place: a fresh temporary per step cost more than the arithmetic (page faults)
    scratch = torch.empty(min(CHUNK, actual.numel()), dtype=torch.float64)
    worst, largest, nonfinite = [], [], False
    for a, r in _pairs(actual, ref, CHUNK):
        diff = scratch[:a.numel()].view(a.shape).copy_(a).sub_(r, alpha=factor).abs_()
        chunk_max = diff.max()
        if not torch.isfinite(chunk_max):
            bad = ~torch.isfinite(a) & torch.isfinite(r)
            nonfinite = nonfinite or bool(bad.any())
            chunk_max = diff.masked_fill_(bad, 0.0).max()
        worst.append(chunk_max)
        if want_largest:
            largest.append(_largest_of(r))
    return torch.stack(worst).max(), nonfinite, torch.stack(largest).max() if want_largest else None


def _device_chunks(actual: torch.Tensor, ref: torch.Tensor, factor: float, want_largest: bool):
    """compare's figures where no chunk may wait for the host (a GPU): every chunk masks its bad entries (cheap
    there), and nothing is read until the end - the same figures as _host_chunks on any device."""
    scratch = torch.empty(min(DEVICE_CHUNK, actual.numel()), dtype=torch.float64, device=ref.device)
    worst, largest, nonfinite = [], [], []
    for a, r in _pairs(actual, ref, DEVICE_CHUNK):
        diff = scratch[:a.numel()].view(a.shape).copy_(a).sub_(r, alpha=factor).abs_()
        bad = ~torch.isfinite(a) & torch.isfinite(r)
        nonfinite.append(bad.any())
        worst.append(diff.masked_fill_(bad, 0.0).max())
        if want_largest:
            largest.append(_largest_of(r))
    return (torch.stack(worst).max(), torch.stack(nonfinite).any(),
            torch.stack(largest).max() if want_largest else None)


#: a timed call's answer is judged on content of its own, not the inputs naive's error was measured on: the naive term
#: of its tolerance counts CONTENT_SPREAD times. An honest kernel's largest error moves with the content (sdpa-flash
#: bf16's dv at 1.02x its tolerance once in ~9,000 judged answers of three main-job runs, 2026-12-07); an answer of
#: other content misses by about |ref|, hundreds of tolerances
CONTENT_SPREAD = 2.0


def judge(quantity: str, actual: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype,
          naive_err: float | None, factor: float = 1.0, terms: float = 0.0, ref_largest: float | None = None,
          spread: float = 1.0) -> Check:
    """Compare one quantity with `factor * ref`; naive_err=None: this *is* the naive baseline (fixed bound); terms:
    Reference.terms_of(quantity) (scaled by |factor| here, as ref is); ref_largest: max |ref|, when known; spread:
    how many times naive's error counts (CONTENT_SPREAD for content it was not measured on)."""
    err, nonfinite, largest = compare(actual, ref, factor, ref_largest)
    return ruled(quantity, err, nonfinite, largest if ref.numel() else 0.0, dtype, naive_err, abs(factor) * terms,
                 spread)


def ruled(quantity: str, err: float, nonfinite: bool, largest: float, dtype: torch.dtype,
          naive_err: float | None, terms: float = 0.0, spread: float = 1.0) -> Check:
    """The Check of a comparison already made (compare's figures): the tolerance the rule above gives."""
    magnitude = max(1.0, largest, terms)
    scale = (f"max(1, max|ref|, terms {terms:.3g})" if terms > largest else "max(1, max|ref|)") + f"={magnitude:.3g}"
    if naive_err is None:
        tol = NAIVE_BOUND[dtype] * magnitude
        rule = f"naive's fixed bound {NAIVE_BOUND[dtype]:g} x {scale}"
    else:
        tol = FACTORS[quantity] * spread * naive_err + FLOORS[dtype] * magnitude
        times = f"{FACTORS[quantity]:g} x {spread:g}" if spread != 1.0 else f"{FACTORS[quantity]:g}"
        rule = f"{times} x naive's err {naive_err:.3g} + {FLOORS[dtype]:g} x {scale}"
    return Check(quantity, err, tol, naive_err, nonfinite, rule, largest)
