"""Dropout statistics and backward-mask consistency, and determinism: real SDPA passes, planted bugs fail."""

import torch

from harness.backends import get_backends
from harness.backends.naive import Naive
from harness.probes.determinism import check_determinism, claim
from harness.probes.dropout import check_dropout

CPU = torch.device("cpu")


class Dropping(Naive):
    """Naive attention with inverted dropout on the weights; knobs plant one bug each."""

    name = "dropping"
    rate_error = 0.0          # drops p + rate_error instead of p
    rescale = True            # divides kept weights by 1 - p
    backward_redraws = False  # the gradient flows through a different mask than the forward used

    native_probes = frozenset({"dropout"})

    def native_dropout(self, q, k, v, *, p, scale):
        probs = torch.softmax((q @ k.transpose(-1, -2)) * scale, -1)
        keep = torch.rand_like(probs) >= p + self.rate_error
        weights = probs * keep / ((1 - p) if self.rescale else 1)
        out = weights @ v
        if self.backward_redraws:
            other = probs * (torch.rand_like(probs) >= p) / (1 - p)
            out = (other @ v) + (out - other @ v).detach()
        return out


def phases(rows):
    return {r.phase: r for r in rows}


def test_sdpa_math_dropout_passes_and_records_its_rng():
    rows = phases(check_dropout(get_backends("sdpa-math")[0], CPU))
    assert rows["fwd"].status == "pass" and rows["bwd"].status == "pass"
    assert "mask sha1" in rows["fwd"].observed and "same seed repeats: yes" in rows["fwd"].observed


def test_correct_planted_dropout_passes():
    rows = phases(check_dropout(Dropping(), CPU))
    assert (rows["fwd"].status, rows["bwd"].status) == ("pass", "pass")


def test_wrong_rate_missing_rescale_and_redrawn_backward_mask_fail():
    wrong_rate = type("WrongRate", (Dropping,), {"rate_error": 0.05})()
    no_rescale = type("NoRescale", (Dropping,), {"rescale": False})()
    redraws = type("Redraws", (Dropping,), {"backward_redraws": True})()
    assert "kept fraction" in phases(check_dropout(wrong_rate, CPU))["fwd"].reason
    reason = phases(check_dropout(no_rescale, CPU))["fwd"].reason
    assert "P/(1-p)" in reason and "biased" in reason
    assert phases(check_dropout(redraws, CPU))["bwd"].status == "fail"


def test_backend_without_dropout_is_unsupported():
    rows = check_dropout(Naive(), CPU)
    assert {r.status for r in rows} == {"unsupported"} and "no dropout" in rows[0].reason


class Jittery(Naive):
    """Backward with run-to-run noise, as atomics-based accumulation gives."""

    deterministic = None  # capabilities are class data: a subclass that changes the kernel drops naive's claim

    name = "jittery"

    def forward(self, q, k, v, **call):
        q.register_hook(lambda g: g + 1e-7 * torch.randn_like(g))
        return super().forward(q, k, v, **call)  # mask, scale and naive's prepared state


def test_determinism_judged_where_claimed_recorded_elsewhere():
    assert claim(Naive()) and claim(get_backends("sdpa")[0]) is None
    assert check_determinism(get_backends("sdpa-math")[0], CPU).status == "pass"
    assert check_determinism(Naive(), CPU).status == "pass"
    noisy = check_determinism(Jittery(), CPU)
    assert noisy.status == "observed" and noisy.observed.startswith("differs: dq")
    claimed = type("ClaimsDeterminism", (Jittery,), {"deterministic": True})()
    assert check_determinism(claimed, CPU).status == "fail"
