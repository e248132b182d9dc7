"""recommend --serving-step: a mixed step (prefill chunk, decodes, verifications) as a workload, ranked like any other,
its exclusions with their reasons."""

import pytest

from harness.advisor.recommend import recommend_workload
from harness.advisor.workload import Workload, model_workloads
from harness.cli.main import main
from harness.measure.timing import TimingConfig
from harness.cases.presets import get_preset
from harness.cases.serving_step import StepMix, parse_mix


def test_a_mix_id_reads_back_and_a_bad_one_says_the_form():
    assert parse_mix("p1x512-d31-v4x4") == StepMix()
    assert parse_mix("p2x64-d3-v0x4").q_lens == (64, 64, 1, 1, 1)
    with pytest.raises(ValueError, match=r"serving step 'p1-d3': must read pPxC-dD-vVxS .* e.g. p1x512-d31-v4x4"):
        parse_mix("p1-d3")


def test_a_serving_step_workload_builds_the_mixed_case_and_checks_its_batch():
    case = Workload(8, 8, 24, 64, kv_heads=2, seq_k=96, page_size=16, serving_step="p1x24-d5-v2x4").case()
    assert case.mask.q_lens == (24,) + (1,) * 5 + (4, 4) and case.seq_k == 95 and case.page_size == 16
    with pytest.raises(ValueError, match="serving step p1x24-d5-v2x4: batch=4, seq_q=24 must be the mix's 8"):
        Workload(4, 8, 24, 64, kv_heads=2, seq_k=96, serving_step="p1x24-d5-v2x4")


def test_a_model_serving_step_takes_the_models_heads():
    (w,) = model_workloads(get_preset("llama-3-8b"), 1, 4096, page_size=16, serving_step="p1x512-d31-v4x4")
    case = w.case()
    assert (case.batch, case.heads, case.kv_heads, case.head_dim, case.seq_q, case.seq_k) == (36, 32, 8, 128, 512, 4095)
    assert w.name == "llama-3-8b step p1x512-d31-v4x4 s4096"


def test_recommend_ranks_backends_on_a_mixed_step_and_says_why_one_cannot():
    workload = Workload(8, 4, 24, 32, kv_heads=2, seq_k=80, dtype="fp32", page_size=16,
                        serving_step="p1x24-d5-v2x4", name="tiny step")
    rec = recommend_workload(workload, backends=["naive", "sdpa", "flash-attn"], device="cpu", checks=False,
                             timing=TimingConfig(warmup_ms=1, budget_ms=20, min_reps=15))
    ranked = rec.table[rec.table["rank"].notna()]
    assert set(ranked.backend) == {"naive", "sdpa"} and (ranked.gbps > 0).all()
    fa2 = rec.table[rec.table.backend == "flash-attn"].iloc[0]
    assert "flash-attn needs page_size % 256 == 0; page_size=16" in fa2.reason


def test_cli_serving_step_refuses_batch_and_decode_flags(capsys):
    code = main(["recommend", "--serving-step", "--batch", "4", "--heads", "8", "--head-dim", "64", "--seq", "96",
                 "--device", "cpu", "--backends", "naive"])
    assert code == 2 and "--serving-step sets the batch and its query lengths" in capsys.readouterr().err


def test_cli_recommend_reads_a_serving_step_from_a_workload_file(tmp_path, capsys):
    """docs/timing.md's `serving_step` key: the same mixed case as --serving-step, ranked under the shape's name."""
    path = tmp_path / "w.toml"
    path.write_text('[[shape]]\nname = "tiny step"\nserving_step = "p1x24-d5-v2x4"\nheads = 4\nkv_heads = 2\n'
                    'head_dim = 32\nseq = 80\npage_size = 16\ndtype = "fp32"\n')
    code = main(["recommend", "--workload", str(path), "--device", "cpu", "--backends", "naive", "--no-checks"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "tiny step" in out.out and "naive" in out.out
