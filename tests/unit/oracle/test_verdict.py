"""harness.oracle.verdict.compare: the chunked comparison gives exactly what the whole-tensor formula gives, NaN
and inf included."""

import math

import pytest
import torch

import harness.oracle.verdict as verdict


def whole_tensor(actual: torch.Tensor, ref: torch.Tensor) -> tuple[float, bool, float]:
    """The formula `compare` must match: bad entries (non-finite where the reference is finite) zeroed, NaN left
    to propagate through max."""
    actual = actual.to(torch.float64)
    bad = ~torch.isfinite(actual) & torch.isfinite(ref)
    diff = (actual - ref).abs().masked_fill(bad, 0.0)
    return float(diff.max()), bool(bad.any()), float(ref.abs().max())


def same(a: tuple, b: tuple) -> bool:
    return all((x == y) or (isinstance(x, float) and math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(verdict, "CHUNK", 7)  # many chunks, and a short last one, on small tensors


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("plant", ["none", "nan", "inf", "-inf", "nan-in-both", "inf-in-both", "ref-nan"])
@pytest.mark.parametrize("where", [0, 6, 7, 49])  # first element, a chunk's last, the next chunk's first, the last
def test_chunked_matches_whole_tensor(dtype, plant, where):
    torch.manual_seed(where)
    ref = torch.randn(2, 5, 5, dtype=torch.float64) * 3
    actual = ref.to(dtype)
    flat_a, flat_r = actual.view(-1), ref.view(-1)
    if plant in ("nan", "inf", "-inf"):
        flat_a[where] = float(plant)
    elif plant == "nan-in-both":
        flat_a[where], flat_r[where] = float("nan"), float("nan")
    elif plant == "inf-in-both":
        flat_a[where], flat_r[where] = float("inf"), float("inf")
    elif plant == "ref-nan":
        flat_r[where] = float("nan")
    assert same(verdict.compare(actual, ref), whole_tensor(actual, ref))


def test_a_planted_nan_fails_the_check_and_an_honest_rounding_passes():
    ref = torch.randn(3, 4, 9, dtype=torch.float64)
    assert verdict.judge("out", ref.to(torch.bfloat16), ref, torch.bfloat16, 0.01).passed
    broken = ref.to(torch.bfloat16)
    broken.view(-1)[20] = float("nan")
    check = verdict.judge("out", broken, ref, torch.bfloat16, 0.01)
    assert check.nonfinite and not check.passed


def test_non_contiguous_output_is_compared_elementwise():
    ref = torch.randn(4, 6, dtype=torch.float64)
    actual = ref.t().contiguous().t()  # same values, transposed strides
    actual[1, 2] += 0.5
    err, nonfinite, largest = verdict.compare(actual, ref)
    assert err == pytest.approx(0.5) and not nonfinite and largest == float(ref.abs().max())


def test_shape_mismatch_and_empty_tensors():
    with pytest.raises(ValueError, match=r"output shape \(2, 3\) != reference shape \(3, 2\)"):
        verdict.compare(torch.zeros(2, 3), torch.zeros(3, 2, dtype=torch.float64))
    assert verdict.compare(torch.zeros(0, 4), torch.zeros(0, 4, dtype=torch.float64))[:2] == (0.0, False)


@pytest.mark.parametrize("factor", [-1.0, 2.0, -0.5, 4.0])
@pytest.mark.parametrize("plant", ["none", "nan", "inf", "ref-nan"])
def test_a_factor_compares_with_the_scaled_reference_exactly(factor, plant):
    """compare(actual, ref, factor) is compare(actual, factor * ref) without making factor * ref (a timed call's
    transform scales the verified answer by a signed power of two): the same figures, bit for bit."""
    torch.manual_seed(3)
    ref = torch.randn(2, 5, 5, dtype=torch.float64)
    actual = (ref * factor).to(torch.float32)
    if plant in ("nan", "inf"):
        actual.view(-1)[8] = float(plant)
    elif plant == "ref-nan":
        ref.view(-1)[8] = float("nan")
    assert same(verdict.compare(actual, ref, factor), whole_tensor(actual, ref * factor))


def test_a_factor_that_is_not_a_power_of_two_is_refused():
    with pytest.raises(ValueError, match=r"compare factor 3.0 is not a signed power of two"):
        verdict.compare(torch.zeros(2), torch.zeros(2, dtype=torch.float64), 3.0)


def test_a_known_largest_reference_entry_gives_the_same_comparison_without_reading_it_again():
    """A timed key's answers are all judged against one reference (PreparedCase.largest reads max |ref| once)."""
    from harness.oracle.verdict import CHUNK, compare

    gen = torch.Generator().manual_seed(0)
    for n in (1000, 3 * CHUNK + 5):  # one chunk, and chunks
        ref = torch.randn(n, generator=gen, dtype=torch.float64)
        actual = (ref * -2 + 1e-3 * torch.randn(n, generator=gen, dtype=torch.float64)).float()
        assert compare(actual, ref, -2.0, float(ref.abs().max())) == compare(actual, ref, -2.0)
