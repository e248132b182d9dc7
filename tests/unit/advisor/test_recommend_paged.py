"""recommend on a serving workload: a paged decode / verification step, bandwidth columns, every exclusion's reason."""

import pytest

from harness.advisor.recommend import recommend_workload
from harness.advisor.table import format_table
from harness.advisor.workload import Workload, workloads_from_mapping
from harness.cli.main import main
from harness.measure.timing import TimingConfig


def test_paged_workload_builds_a_cache_causal_case():
    case = Workload(4, 8, 4, 64, kv_heads=2, seq_k=300, page_size=16).case()
    assert case.page_size == 16 and case.mask_kind == "cache-causal" and case.seq_q == 4
    assert case.seq_k == 299 and all(n % 16 for n in case.mask.lengths)


def test_recommend_ranks_a_paged_verification_with_bandwidth_and_explains_exclusions():
    workload = Workload(2, 4, 4, 32, kv_heads=2, seq_k=100, dtype="fp32", page_size=16, name="tiny verify")
    rec = recommend_workload(workload, backends=["naive", "sdpa", "flash-attn"], device="cpu", checks=False,
                             timing=TimingConfig(warmup_ms=1, budget_ms=20, min_reps=15))
    ranked = rec.table[rec.table["rank"].notna()]
    assert set(ranked.backend) == {"naive", "sdpa"} and (ranked.pct_of_bw_peak > 0).all() and (ranked.gbps > 0).all()
    text = format_table(rec)
    assert "GB/s" in text and "%bw" in text
    fa2 = rec.table[rec.table.backend == "flash-attn"].iloc[0]
    assert fa2.status == "unavailable" and "flash-attn needs page_size % 256 == 0; page_size=16" in fa2.reason


def test_cli_gives_the_cost_estimate_and_the_flag_for_the_full_size_workload_on_cpu(capsys):
    code = main(["recommend", "--preset", "llama-3-8b", "--decode", "--page-size", "16", "--spec-len", "4",
                 "--batch", "64", "--seq", "32768", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "--allow-expensive" in err and "page16" in err and "GiB" in err


REFUSED = "mistral-7b's mask is window4096; paged workloads and serving steps are causal decoders"


def test_cli_refuses_a_paged_window_model(capsys):
    code = main(["recommend", "--preset", "mistral-7b", "--page-size", "16", "--batch", "1", "--seq", "64",
                 "--device", "cpu", "--backends", "naive"])
    assert code == 2 and REFUSED in capsys.readouterr().err


def test_a_workload_file_refuses_a_paged_window_model_as_the_flags_do():
    """A file's paged shape of a windowed preset once became a cache-causal case that dropped the window."""
    with pytest.raises(ValueError, match=f"workload shape 1: {REFUSED}"):
        workloads_from_mapping({"shape": [{"preset": "mistral-7b", "batch": 1, "seq_q": 1, "seq_k": 64,
                                           "page_size": 16}]})
    with pytest.raises(ValueError, match=f"workload shape 1: {REFUSED}"):  # and a serving step's route
        workloads_from_mapping({"shape": [{"preset": "mistral-7b", "seq": 64, "page_size": 16,
                                           "serving_step": True}]})


def test_require_batch_invariant_excludes_a_backend_that_is_not(monkeypatch):
    from harness.advisor import recommend as module

    def fake_check(backend, device, case, seed=0):  # the probe's own behaviour is tests/unit/probes' business
        same = backend.name == "naive"
        return {"batch_invariant": "yes" if same else "no",
                "batch_invariance_note": "bitwise equal" if same else "differs (max |diff| 1e-07)"}

    monkeypatch.setattr(module, "batch_invariance_check", fake_check)
    workload = Workload(2, 4, 1, 32, kv_heads=2, seq_k=100, dtype="fp32", page_size=16)
    rec = recommend_workload(workload, backends=["naive", "sdpa"], device="cpu", checks=False,
                             timing=TimingConfig(warmup_ms=1, budget_ms=20, min_reps=15), require=("batch-invariant",))
    sdpa = rec.table[rec.table.backend == "sdpa"].iloc[0]
    assert rec.winner == "naive" and sdpa.status == "excluded"
    assert sdpa.reason == "--require batch-invariant: differs (max |diff| 1e-07)"
    assert "batch_inv" in format_table(rec)
