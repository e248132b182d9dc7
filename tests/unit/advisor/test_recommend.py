"""recommend: ranking and tie rule on synthetic samples, workload files, deployment checks, one real CPU run."""

import math
import sys
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from harness.backends import get_backends
from harness.backends.base import Backend
from harness.cases.case import AttentionCase
from harness.cli.main import main
from harness.cases.case import make_inputs
from harness.advisor.deploy_checks import check_case, compile_check, cuda_graph_check, determinism_check, mask_path
from harness.store import environment as env
from harness.cases.masks import parse_mask
from harness.advisor.evidence import Evidence, evidence_from_run
from harness.advisor.ranking import overall, rank_backends, tie_groups
from harness.advisor.workload import Workload, load_workloads
from harness.measure.timing import TimingConfig
from harness.recommend import recommend
from tests.fixtures.regress_fixtures import write_run

CPU = torch.device("cpu")
MiB = 2 ** 20


def samples(median: float = 1.0, seed: int = 0, n: int = 200) -> tuple[float, ...]:
    """Right-skewed latencies (ms) around `median`, like a real timer's."""
    rng = np.random.default_rng(seed)
    return tuple(median * rng.lognormal(0.0, 0.05, n))


def ev(name: str, median: float = 1.0, seed: int = 0, *, mem: float = MiB, det: str = "yes",
       package: str | None = None, status: str = "pass", reason: str = "", samples_ms=None) -> Evidence:
    """Synthetic evidence: a verdict, samples around `median`, peak memory and the determinism check's answer."""
    return Evidence(name, status, reason, 0.1, samples(median, seed) if samples_ms is None else samples_ms, mem,
                    package, {"deterministic": det})


def by_backend(df: pd.DataFrame) -> pd.DataFrame:
    return df.set_index("backend")


# ---- ranking and ties on synthetic measurements ----

def test_indistinguishable_samples_tie_and_lower_memory_wins():
    rec = rank_backends([ev("fat", 1.0, seed=1, mem=8 * MiB), ev("lean", 1.0, seed=2, mem=2 * MiB)])
    t = by_backend(rec.table)
    assert t.loc["fat", "tie_group"] == t.loc["lean", "tie_group"] == 1
    assert t.loc["fat", "timing_verdict"] in ("tied", "tied (too noisy to tell)")  # the advisor's words
    assert rec.winner == "lean" and t.loc["lean", "rank"] == 1 and t.loc["fat", "rank"] == 2
    assert "chosen over fat for lower peak memory (2 MiB vs 8 MiB)" in rec.explanation


def test_tie_with_equal_memory_prefers_determinism_then_fewer_packages():
    rec = rank_backends([ev("atomic", 1.0, seed=1, det="no"), ev("steady", 1.0, seed=2, det="yes")])
    assert rec.winner == "steady" and "deterministic" in rec.explanation
    rec = rank_backends([ev("plugin", 1.0, seed=1, package="xformers"), ev("builtin", 1.0, seed=2)])
    assert rec.winner == "builtin" and "nothing beyond torch" in rec.explanation
    assert by_backend(rec.table).loc["plugin", "deps"] == "torch + xformers"


def test_clearly_faster_backend_is_sole_winner_despite_more_memory():
    rec = rank_backends([ev("slow", 1.5, seed=1, mem=MiB), ev("fast", 1.0, seed=2, mem=64 * MiB)])
    t = by_backend(rec.table)
    assert rec.winner == "fast"
    assert t.loc["fast", "tie_group"] == 1 and t.loc["slow", "tie_group"] == 2  # memory only decides inside a tie
    assert t.loc["slow", "vs_fastest"] == pytest.approx(1.5, rel=0.03)
    assert "significantly ahead" in rec.explanation


def test_too_few_samples_are_undecided_hence_tied():
    # 5 vs 5 samples cannot reach p < 0.002 even fully separated: the statistic says undecided, so they tie
    rec = rank_backends([ev("a", 1.0, samples_ms=samples(1.0, 1, n=5)), ev("b", 2.0, samples_ms=samples(2.0, 2, n=5),
                                                                          mem=MiB / 2)])
    t = by_backend(rec.table)
    assert t.loc["a", "tie_group"] == t.loc["b", "tie_group"] == 1
    assert t.loc["b", "timing_verdict"] == "tied (too noisy to tell)" and rec.winner == "b"
    assert "too noisy" in rec.explanation


def test_failing_and_missing_backends_are_excluded_with_reasons():
    rec = rank_backends([
        ev("good", 1.0),
        ev("wrong", 0.5, status="fail", reason="dq_err 0.3 > dq_tol 0.2"),  # faster, but never recommended
        Evidence("absent", "unavailable", "needs CUDA; device is cpu"),
        Evidence("huge", "oom", "out of memory: tried 80 GiB"),
        Evidence("untimed", "pass"),
    ])
    t = by_backend(rec.table)
    assert rec.winner == "good" and t.loc["good", "rank"] == 1
    for name, status in (("wrong", "fail"), ("absent", "unavailable"), ("huge", "oom"), ("untimed", "not-timed")):
        assert math.isnan(t.loc[name, "rank"]) and t.loc[name, "status"] == status and t.loc[name, "reason"]
    assert t.loc["wrong", "reason"] == "dq_err 0.3 > dq_tol 0.2"


def test_nothing_eligible_has_no_winner():
    rec = rank_backends([Evidence("x", "unsupported", "head_dim 512 > max 256")])
    assert rec.winner is None and "x (unsupported)" in rec.explanation


def test_later_tie_groups_anchor_on_their_own_fastest():
    groups = tie_groups([ev("a", 1.0, 1), ev("b", 2.0, 2), ev("c", 2.0, 3, mem=MiB / 4), ev("d", 4.0, 4)])
    assert [[e.backend for e in g] for g in groups] == [["a"], ["c", "b"], ["d"]]


def test_overall_picks_best_geometric_mean_rank_among_backends_ranked_everywhere():
    prefill = rank_backends([ev("x", 1.0, 1), ev("y", 1.3, 2), ev("z", 0.5, 3)])
    decode = rank_backends([ev("x", 1.3, 4), ev("y", 1.0, 5), Evidence("z", "unsupported", "no decode")])
    rec = overall({"prefill": prefill, "decode": decode})
    t = by_backend(rec.table)
    assert math.isnan(t.loc["z", "overall_rank"]) and "decode: unsupported" in t.loc["z", "excluded_on"]
    assert t.loc["x", "geomean_rank"] == pytest.approx(2.0)  # ranks 2 and 2 (z leads prefill)
    assert t.loc["y", "geomean_rank"] == pytest.approx(math.sqrt(3 * 1))
    assert rec.winner == "y" and t.loc["y", "overall_rank"] == 1 and "ranks 3, 1" in rec.explanation


def test_terminal_table_names_winner_ties_and_every_exclusion():
    from harness.advisor.table import format_table

    rec = rank_backends([ev("fat", 1.0, 1, mem=8 * MiB), ev("lean", 1.0, 2, mem=2 * MiB), ev("slow", 3.0, 3),
                        Evidence("absent", "unavailable", "needs CUDA; device is cpu")])
    text = format_table(replace(rec, workload="w", case_id="w", phase="fwd", device="cpu", device_name="Test CPU",
                                threads=1))
    assert "winner: lean" in text and "tied within noise (same tie group): {lean, fat}" in text
    assert "absent  unavailable  needs CUDA; device is cpu" in text and "inference (fwd) on cpu" in text


# ---- workload files ----

GOOD_TOML = """
[defaults]
dtype = "fp32"
heads = 8
kv-heads = 2
head_dim = 64
seq = 512

[[shape]]
name = "prefill"
batch = 1
mask = "causal"

[[shape]]
name = "decode"
batch = 4
seq_q = 1
mask = "none"
training = false
"""


def test_workload_file_with_defaults_gives_one_workload_per_shape(tmp_path):
    path = tmp_path / "model.toml"
    path.write_text(GOOD_TOML)
    prefill, decode = load_workloads(path)
    assert prefill.case().id == "fp32-b1-h8kv2-s512-d64-causal" and prefill.label == "prefill"
    assert (decode.seq_q, decode.seq_k, decode.batch, decode.mask) == (1, 512, 4, "none")
    assert [w.training for w in load_workloads(path, training=True)] == [True, False]  # the file's own value wins


@pytest.mark.parametrize("text, message", [
    ("[[shape]\nbatch = 1", "not valid TOML"),
    ("[[shape]]\nbatch = 1\nheads = 4\nseq = 64\nhead_dim = 32\nlayers = 3", "unknown key(s) 'layers'; allowed:"),
    ("[[shape]]\nbatch = 1\nheads = 4\nseq = 64\nhead_dim = 32\ndtype = \"fp8\"", "unknown dtype 'fp8'; allowed"),
    ("[[shape]]\nbatch = 1\nheads = 6\nkv_heads = 4\nseq = 64\nhead_dim = 32", "heads=6 is not a multiple"),
    ("[[shape]]\nbatch = 1\nheads = 4\nseq = 64\nhead_dim = 32\nmask = \"diag\"", "unknown mask 'diag'; allowed"),
    ("[[shape]]\nbatch = 1\nheads = 4\nhead_dim = 32", "missing seq_q"),
    ("[[shape]]\nbatch = 1\nheads = 4\nseq = 64\nseq_q = 2\nhead_dim = 32", "not both"),
    ("[[shape]]\nbatch = 1\nheads = 4\nseq = 64\nhead_dim = 32\ntraining = \"yes\"", "training='yes'"),
    ("shape = []", "non-empty list 'shape'"),
    ("model = \"llama\"\n[[shape]]\nbatch = 1", "unexpected top level ['model']"),
])
def test_malformed_workload_file_names_the_bad_value(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match="bad.toml") as info:
        load_workloads(path)
    assert message in str(info.value)


def test_workload_file_suffix_and_missing_yaml(tmp_path, monkeypatch):
    (tmp_path / "w.json").write_text("{}")
    with pytest.raises(ValueError, match=r"suffix '.json'; allowed: .toml, .yaml, .yml"):
        load_workloads(tmp_path / "w.json")
    (tmp_path / "w.yaml").write_text("shape: []")
    monkeypatch.setitem(sys.modules, "yaml", None)  # as if PyYAML were not installed
    with pytest.raises(ValueError, match="needs PyYAML"):
        load_workloads(tmp_path / "w.yaml")


def harness(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


@pytest.mark.parametrize("args, message", [
    (["--dtype", "fp8"], "error: unknown dtype 'fp8'; allowed: fp32, fp16, bf16, fp64"),
    (["--mask", "diag"], "error: unknown mask 'diag'; allowed: none, causal"),
    (["--kv-heads", "3"], "error: heads=4 is not a multiple of kv_heads=3"),
    (["--backends", "nope"], "error: unknown backend 'nope'; allowed: naive"),
])
def test_cli_bad_input_exits_2_naming_the_value(capsys, args, message):
    r = harness(capsys, "recommend", "--batch", "1", "--heads", "4", "--seq", "16", "--head-dim", "8",
                "--device", "cpu", *args)
    assert r.returncode == 2 and message in r.stderr


def test_cli_needs_a_shape_or_a_workload_file_not_both(capsys, tmp_path):
    r = harness(capsys, "recommend", "--batch", "1")
    assert r.returncode == 2 and "missing --heads, --seq, --head-dim" in r.stderr
    (tmp_path / "w.toml").write_text(GOOD_TOML)
    r = harness(capsys, "recommend", "--workload", str(tmp_path / "w.toml"), "--seq", "64")
    assert r.returncode == 2 and "drop --seq" in r.stderr


# ---- deployment checks ----

def _case(mask: str, batch: int = 2, seq: int = 64) -> AttentionCase:
    return AttentionCase(batch, 4, seq, 32, torch.float32, kv_heads=2, mask=parse_mask(mask, batch=batch, seq_k=seq))


def test_mask_path_comes_from_each_backends_translation():
    b = {x.name: x for x in get_backends(None)}
    causal, pad = _case("causal"), _case("keypad")
    assert mask_path(b["sdpa"], CPU, causal)["mask_path"] == "native"  # is_causal=True
    assert mask_path(b["flash-attn"], CPU, causal)["mask_path"] == "native"
    assert mask_path(b["flex"], CPU, pad)["mask_path"] == "native"
    dense = mask_path(b["sdpa"], CPU, pad)
    assert dense["mask_path"] == "dense" and dense["dense_mask_bytes"] == 2 * 64 * 64  # bool (B, 1, Sq, Sk)
    naive = mask_path(b["naive"], CPU, causal)
    assert naive["mask_path"] == "dense" and naive["dense_mask_bytes"] == 64 * 64
    assert mask_path(b["flash-attn"], CPU, _case("causal+keypad"))["mask_path"] == "unsupported"
    assert mask_path(b["sdpa"], CPU, _case("none"))["mask_path"] == "none"


def test_mask_path_xformers_typed_is_native_tensor_bias_is_dense():
    pytest.importorskip("xformers.ops.fmha.attn_bias")
    xf = get_backends("xformers")[0]
    assert mask_path(xf, CPU, _case("causal"))["mask_path"] == "native"
    dense = mask_path(xf, CPU, _case("keypad"))  # float bias (B, G, H/G, Sq, Sk), rows padded to 8
    assert dense["mask_path"] == "dense" and dense["dense_mask_bytes"] == 2 * 2 * 2 * 64 * 64 * 4


class Jittery(Backend):
    """Correct to ~1e-6 but never the same twice: a stand-in for atomics in a backward."""

    name = "jittery"

    def forward(self, q, k, v, *, mask, scale):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
        return out + 1e-6 * torch.randn_like(out)


class Breaks(Backend):
    name = "breaks"

    def forward(self, q, k, v, *, mask, scale):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
        torch._dynamo.graph_break()  # the line the note must name
        return out * 1


def test_determinism_check_tells_bitwise_repeatable_from_not():
    case = _case("causal")
    inputs = make_inputs(case)
    naive = get_backends("naive")[0]
    assert determinism_check(naive, case, CPU, inputs, training=True)[0] == "yes"
    verdict, note = determinism_check(Jittery(), case, CPU, inputs, training=True)
    assert verdict == "no" and "out (max |diff|" in note


def test_compile_check_counts_breaks_and_names_the_line():
    case = _case("causal")
    ok = compile_check(get_backends("sdpa")[0], case, CPU, training=False, compile_backend="eager")
    assert ok["compiles"] == "yes" and ok["graph_breaks"] == 0
    bad = compile_check(Breaks(), case, CPU, training=False, compile_backend="eager")
    assert bad["compiles"] == "no" and bad["graph_breaks"] >= 1
    assert "tests/unit/advisor/test_recommend.py" in bad["compile_note"] and "graph_break()" in bad["compile_note"]


def test_checks_on_cpu_use_a_small_shape_and_skip_cuda_graphs():
    big = AttentionCase(8, 32, 4096, 128, torch.bfloat16, kv_heads=8,
                        mask=parse_mask("causal+keypad", batch=8, seq_k=4096))
    small = check_case(big)
    assert (small.batch, small.heads, small.kv_heads, small.seq_q, small.head_dim) == (2, 4, 2, 128, 128)
    assert small.mask_kind == "causal+keypad" and small.dtype == torch.bfloat16
    assert cuda_graph_check(get_backends("sdpa")[0], small, CPU, make_inputs(small), training=False) == "n/a (cpu)"


# ---- evidence from an existing run ----

def test_results_dir_is_used_when_it_measured_the_workload_here(tmp_path):
    w = Workload(1, 4, 32, 16, kv_heads=2, dtype="fp32", mask="causal")
    key = (w.case().id, "sdpa", "fwd")
    run = write_run(tmp_path / "run", {key: {"peak_mem_bytes": 1234}, (w.case().id, "naive", "fwd"):
                                       {"status": "fail", "reason": "out_err too big"}},
                    {key: np.array(samples(0.2, 7, n=30))}, testbed=env.testbed_id(CPU))
    found, note = evidence_from_run(run, w.case(), "fwd", get_backends("sdpa,naive,flex"), CPU)
    assert set(found) == {"sdpa", "naive"} and found["sdpa"].eligible and found["sdpa"].peak_mem_bytes == 1234
    assert found["naive"].status == "fail" and found["naive"].source == "run run"  # flex: not in the run, measured now
    elsewhere = write_run(tmp_path / "other", {key: {}}, {key: np.array(samples(0.2, 7, n=30))}, testbed="tb-gpu")
    assert evidence_from_run(elsewhere, w.case(), "fwd", get_backends("sdpa"), CPU)[0] == {}
    assert "was not measured there" in evidence_from_run(run, w.case(), "fwd+bwd", get_backends("sdpa"), CPU)[1]


# ---- one real run on CPU ----

def test_end_to_end_tiny_cpu_workload():
    # explicit backends: other tests register deliberately broken plugins in this same process
    builtins = ["naive", "sdpa", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flex", "xformers",
                "flash-attn"]
    rec = recommend(1, 4, 128, 64, kv_heads=2, dtype="fp32", mask="causal", device="cpu", backends=builtins,
                   timing=TimingConfig(warmup_ms=5, budget_ms=40, min_reps=10), compile_backend="eager")
    t = by_backend(rec.table)
    # flex needs inductor's AVX2 path on a CPU (ATEN_CPU_CAPABILITY=default: unavailable, with the reason)
    flex = get_backends(["flex"])[0].unavailable_reason(CPU) is None
    ranked = {"naive", "sdpa", "sdpa-math", "sdpa-flash"} | ({"flex"} if flex else set())
    assert ranked <= set(t.index[t["rank"].notna()])
    for name in ("xformers", "flash-attn", "sdpa-efficient", "sdpa-cudnn", *(() if flex else ("flex",))):
        assert math.isnan(t.loc[name, "rank"]) and t.loc[name, "status"] == "unavailable" and t.loc[name, "reason"]
    r = t.loc[list(ranked)]
    assert (r.status == "pass").all() and (r.err_ratio < 1).all() and (r.n_samples >= 10).all()
    assert (r.peak_mem_bytes > 0).all() and set(r.cuda_graph) == {"n/a (cpu)"}
    assert t.loc["sdpa", "compiles"] == "yes" and t.loc["sdpa", "mask_path"] == "native"
    assert t.loc["naive", "mask_path"] == "dense" and t.loc["naive", "dense_mask_bytes"] == 128 * 128
    assert set(r.deterministic) <= {"yes", "no"}
    assert sorted(r["rank"]) == list(range(1, len(ranked) + 1)) and rec.winner in ranked
    assert t.loc[rec.winner, "rank"] == 1


def test_gemma_preset_ranks_only_backends_passing_softcap_on_both_layer_kinds():
    from harness.advisor.recommend import recommend_many
    from harness.advisor.workload import model_workloads
    from harness.cases.presets import get_preset

    workloads = model_workloads(get_preset("gemma-2-9b"), 1, 32, dtype="fp32")
    assert [w.case().id for w in workloads] == ["fp32-b1-h16kv8-s32-d256-window4096-0-cap50",
                                                "fp32-b1-h16kv8-s32-d256-causal-cap50"]
    picks, total = recommend_many(workloads, backends=["naive", "sdpa-math"], device="cpu", checks=False,
                                  timing=TimingConfig(warmup_ms=5, budget_ms=20, min_reps=5))
    assert total.winner == "naive"
    row = total.table.set_index("backend").loc["sdpa-math"]
    assert math.isnan(row.overall_rank) and row.excluded_on.count("unsupported") == 2
    for rec in picks.values():
        assert "SDPA has no softcap" in by_backend(rec.table).loc["sdpa-math", "reason"]


# ---- progress while it runs ----

def test_progress_counts_steps_with_elapsed_and_an_estimate_left():
    import io

    from harness.advisor.progress import Progress

    now = iter([0.0, 10.0, 30.0, 60.0])
    out = io.StringIO()
    p = Progress(3, out=out, clock=lambda: next(now))
    assert p.step("reference") == "[1/3] reference; 10 s elapsed, ~20 s left"
    assert p.step("sdpa pass") == "[2/3] sdpa pass; 30 s elapsed, ~15 s left"
    assert p.step("checks") == "[3/3] checks; 60 s elapsed, done"
    assert out.getvalue().count("\n") == 3


def test_recommend_shows_each_step_on_stderr_as_it_ends(capsys):
    from harness.advisor.recommend import recommend_many, steps_per_workload

    w = Workload(1, 2, 16, 16, dtype="fp32", mask="causal")
    recommend_many([w], backends="naive,sdpa-math", device="cpu", checks=False, progress=True,
                   timing=TimingConfig(warmup_ms=1.0, budget_ms=5.0, min_reps=3))
    lines = capsys.readouterr().err.splitlines()
    n = steps_per_workload(2)
    assert [line.split("]")[0] for line in lines] == [f"[{i}/{n}" for i in range(1, n + 1)]
    assert "float64 reference" in lines[0] and "naive pass, timed: median" in lines[1]
    assert "elapsed, ~" in lines[1] and lines[-1].endswith("elapsed, done")


def test_a_plugins_undescribed_mask_path_is_named_so():
    from harness.backends.base import NOT_DESCRIBED

    class Plain(Backend):
        name = "plain-plugin"

    form = mask_path(Plain(), CPU, _case("causal"))
    assert form["mask_path"] == NOT_DESCRIBED == "not described by the plugin" and "mask_form" in form["mask_note"]


def test_a_tie_never_reads_as_significant_beside_its_p_value():
    """The table prints each p with the level it was held to, and an undecided pair whose rank test is below the
    level (its rounds disagree) is not 'too noisy to tell' (issue 48: 'tied (too noisy to tell) p=0.007')."""
    from harness.advisor.ranking import advisor_word
    from harness.advisor.table import format_table
    from harness.measure.stats import TieConfig, TimingVerdict

    rec = rank_backends([ev("a", 1.0, samples_ms=samples(1.0, 1, n=5)), ev("b", 2.0, samples_ms=samples(2.0, 2, n=5),
                                                                          mem=MiB / 2)])
    p = by_backend(rec.table).loc["b", "p_value"]
    assert p >= rec.alpha and f"tied (too noisy to tell) p={p:.2g} >= {rec.alpha:g}" in format_table(rec)
    cfg = TieConfig()
    unconfirmed = TimingVerdict("undecided", "ratio 1.2 but not across rounds", n_base=30, n_new=30, p_value=1e-6)
    assert advisor_word(unconfirmed, cfg) == "tied (differs, not confirmed)"
    assert advisor_word(TimingVerdict("undecided", n_base=30, n_new=30, p_value=0.3), cfg) == "tied (too noisy to tell)"


def test_progress_on_an_estimate_starts_from_it_and_moves_to_the_measured_pace():
    """A first step 10x its estimate projects the rest at a pace between the estimate's and the step's, not 10x
    (recommend's first line once said ~164 min left, the next ~85); with the estimate borne out it projects it."""
    from harness.advisor.progress import ESTIMATE_SHARE, Progress
    weights = [10.0] * 10                                                # 100 s estimated, 10 s a step
    now = iter([0.0, 100.0, 110.0])
    p = Progress(10, weights=weights, estimated=True, clock=lambda: next(now), say=lambda line: None)
    prior = ESTIMATE_SHARE * 100
    assert p.step("ref").endswith(f"~{(100 + prior) / (10 + prior) * 90 / 60:.1f} min left")   # 5.2x, not 10x
    assert Progress(10, weights=weights, clock=iter([0.0, 100.0]).__next__, say=lambda line: None
                    ).step("ref").endswith("~15.0 min left")                                   # plain: 10x
    on_time = Progress(10, weights=weights, estimated=True, clock=iter([0.0, 10.0]).__next__, say=lambda l: None)
    assert on_time.step("ref").endswith("~90 s left")
