"""The run report from a synthetic run: sections, links that resolve, winners, filters, CLI errors."""

import re
from html.parser import HTMLParser

import pytest

from harness.cli.main import main
from harness.report.document import build_report
from harness.report.analysis import headline, winners
from harness.report.data import load_run
from tests.fixtures.synthetic_run import write_run

SMALL = dict(seqs=(128, 256), dtypes=("fp32",), masks=("none", "causal"))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("run"), **SMALL)


@pytest.fixture(scope="module")
def report(run_dir):
    return build_report(run_dir)


class _Ids(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.hrefs, self.images = set(), [], 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.ids.add(attrs.get("id"))
        if tag == "a" and attrs.get("href", "").startswith("#"):
            self.hrefs.append(attrs["href"][1:])
        if tag == "img" and attrs.get("src", "").startswith("data:image/png;base64,"):
            self.images += 1


def test_html_is_self_contained_and_its_links_resolve(report, run_dir):
    assert report == run_dir / "report.html"
    page = _Ids()
    page.feed(report.read_text())
    assert page.images == len(list((run_dir / "figures").glob("*.png"))) >= 7
    assert page.hrefs and set(page.hrefs) <= page.ids  # every failure link lands on its row
    assert "src='figures/" not in report.read_text()


def test_markdown_has_every_section_and_figure(report, run_dir):
    md = (run_dir / "report.md").read_text()
    for section in ("## Environment", "## Headline per backend", "## Winner per shape group", "## Figures",
                    "## Semantics", "## Failures (2)", "## Not run, and why"):
        assert section in md, section
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert images and all((run_dir / p).is_file() for p in images)
    assert {p.split("/")[1].split("-")[0].removesuffix(".png") for p in images} == {
        "latency", "speedup", "memory", "tflops", "err_ratio", "support", "semantics", "roofline"}
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', md))
    assert set(re.findall(r"\]\(#([^)]+)\)", md)) <= anchors
    assert "cpu-monotonic" in md and "fp32 1 TFLOP/s" in md  # timing mode and measured peak
    assert "| fully-masked-row:out | nan | 0 | 0 | 0 |" in md  # the semantics table, 'nan' as observed
    # the timing-fidelity row measures the timer: listed with the environment, never as a semantics question
    semantics = md.split("## Semantics", 1)[1]
    assert "fidelity" not in semantics and "Timer = 1.004" not in semantics
    assert "| timing fidelity | fp32-b1-h8-s512-d64-causal " in md and "Timer = 1.004" in md


def test_headline_and_winners(run_dir):
    run = load_run(run_dir)
    head = headline(run).set_index("backend")
    assert head.loc["naive", "passed"] == 4 and head.loc["sdpa-flash", "failed"] == 1
    assert head.loc["flex", "of which partly run"] == 3 and head.loc["xformers", "not run"] == 4
    assert head.loc["sdpa-flash", "median speedup fwd"] > 1 and head.loc["naive", "median speedup fwd"] == 1
    win = winners(run)
    failed = win[(win.seq_k == 256) & (win["mask"] == "causal") & (win.phase != "fwd")]
    assert set(failed.winner) == {"naive"}  # sdpa-flash is faster but failed bwd there: it cannot win
    # sdpa-flash's fwd beyond the measured peak (suspicious) wins nothing: the next fastest does (issue 62 item 4)
    none = win[win["mask"] == "none"]
    assert set(none[none.phase != "fwd"].winner) == {"sdpa-flash"} and "sdpa-flash" not in set(none.winner[
        (none.phase == "fwd") & (none.seq_k == 256)])


def test_correctness_only_and_single_backend_reports(tmp_path):
    only = build_report(write_run(tmp_path / "c", perf=False, **SMALL))
    md = only.with_suffix(".md").read_text()
    assert "Correctness-only run" in md and "Winner per shape group" not in md
    assert "Not drawn (no data in this run): Latency, Speedup, Peak memory, Throughput" in md
    single = build_report(write_run(tmp_path / "s", backends=("sdpa-flash",), seqs=(128, 256), dtypes=("fp32",),
                                    masks=("none",), semantics=False))
    md = single.with_suffix(".md").read_text()
    assert "figures/latency.png" in md and "No semantics observations" in md


def test_filters_keep_the_baseline_and_name_bad_values(run_dir, tmp_path):
    run = load_run(run_dir, backends=["flex"], dtype="float32", mask="causal")
    assert set(run.df.backend) == {"flex", "naive"} and set(run.cases["mask"]) == {"causal"}
    assert run.df.speedup.notna().any()
    for kwargs, needle in [({"backends": ["nope"]}, "backend 'nope'"), ({"dtype": "bf16"}, "dtype 'bf16'"),
                           ({"mask": "keypad"}, "mask 'keypad'"),
                           ({"baseline": "sdpa", "strict_baseline": True}, "baseline 'sdpa'")]:
        with pytest.raises(ValueError, match=needle):
            load_run(run_dir, **kwargs)
    with pytest.raises(FileNotFoundError, match="no run directory"):
        load_run(tmp_path / "missing")
    window = load_run(write_run(tmp_path / "w", backends=("naive",), seqs=(128, 256), dtypes=("fp32",),
                                masks=("window",), perf=False), mask="window")
    assert set(window.cases["mask"]) == {"window32-0", "window64-0"}  # a family spans its sized ids


def test_cli_report_and_errors(run_dir, tmp_path, capsys):
    tiny = write_run(tmp_path / "tiny", backends=("naive", "sdpa-flash", "flex"), seqs=(128,), dtypes=("fp32",),
                     masks=("none",), semantics=False, perf=False)  # few figures: the CLI is under test here
    out = tmp_path / "out"
    assert main(["report", str(tiny), "--backends", "sdpa-flash", "--mask", "none", "--out", str(out / "one")]) == 0
    assert list((out / "one" / "figures").glob("*.png")) and (out / "one" / "report.md").is_file()
    assert main(["report", str(tiny), "--baseline", "naive", "--dtype", "fp32", "--out", str(out)]) == 0
    assert (out / "report.html").is_file() and (out / "report.md").is_file()
    capsys.readouterr()
    for args, needle in [(["--backends", "naive,nope"], "backend 'nope' is not in this run"),
                         (["--baseline", "flash-attn"], "baseline 'flash-attn' is not in this run")]:
        assert main(["report", str(run_dir), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0]
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "no run directory" in capsys.readouterr().err


def test_markdown_escapes_what_it_takes_from_data(tmp_path):
    """Backend names and reasons come from plugins and exceptions: no raw HTML may reach report.md."""
    import pandas as pd

    from harness.report.render import Para, Table, to_markdown

    md = to_markdown([Para("backend <b>evil</b> and a [link](#failures)"),
                      Table(pd.DataFrame({"reason": ["<script>alert(1)</script> | pipe"]}))], tmp_path)
    assert "<script>" not in md and "<b>" not in md
    assert "&lt;script&gt;" in md and "&lt;b&gt;evil" in md and "[link](#failures)" in md


def test_report_splits_by_modifier(tmp_path):
    """A run with modifier cases gets a Modifiers section: per backend and modifier family, the statuses and the
    path the modifiers took; case groups and winners keep the families apart."""
    import harness
    from harness import AttentionCase
    from harness.report.analysis import case_group, modifier_support
    from harness.cases.masks import Causal

    cases = [AttentionCase(1, 2, 16, 8, "fp32", mask=Causal(), softcap=5.0),
             AttentionCase(1, 2, 16, 8, "fp32", sinks=True, alibi=True), AttentionCase(1, 2, 16, 8, "fp32")]
    harness.check(["naive", "sdpa-math", "sdpa-cudnn"], cases, "cpu").to_csv(tmp_path / "results.csv", index=False)
    run = load_run(tmp_path)
    table = modifier_support(run).set_index(["backend", "modifiers"])
    # a backend unavailable here (sdpa-cudnn: CUDA only) is one line, not a row per family (issue 67)
    assert set(table.index) == {(b, m) for b in ("naive", "sdpa-math") for m in ("cap", "sink-alibi")} | {
        ("sdpa-cudnn", "all 2 families")}
    assert table.loc[("sdpa-cudnn", "all 2 families"), "statuses"] == "unavailable 4"
    assert "CUDA-only" in table.loc[("sdpa-cudnn", "all 2 families"), "reason"]
    assert table.loc[("sdpa-math", "cap"), "statuses"] == "unsupported 2"
    assert "SDPA has no softcap" in table.loc[("sdpa-math", "cap"), "reason"]
    assert table.loc[("sdpa-math", "sink-alibi"), "path"] == \
        "attn_mask float (alibi) + sink as an appended zero key/value"
    groups = set(run.verdicts.apply(case_group, axis=1))
    assert {"fp32 · causal · cap", "fp32 · none · sink-alibi", "fp32 · none"} <= groups
    from harness.report.document import report_blocks
    from harness.report.render import Heading
    headings = [b.text for b in report_blocks(run, {}, None) if isinstance(b, Heading)]
    assert "Modifiers" in headings


def test_the_support_caption_names_the_backends_left_out(tmp_path):
    """A backend unavailable on every case (xformers in the synthetic CPU run) is not drawn as a grey column;
    the report's caption says which and where the reason is (issue 35)."""
    from pathlib import Path

    from harness.report.document import _figures_section

    run = load_run(write_run(tmp_path, perf=False, seqs=(128,), dtypes=("fp32",), masks=("causal",)))
    text = " ".join(getattr(b, "text", "") for b in _figures_section({"support": [Path("support.png")]}, run))
    assert "Not shown: xformers, unavailable on every case here" in text


def test_the_headline_counts_the_matrix_as_the_summary_does_and_the_probes_apart(tmp_path):
    """One vocabulary (issue 35: the summary said naive '51 pass 0 fail', the report's headline '91 cases' and
    'failed 2', the fp16 edge probes): the headline's cases are the matrix's, the probes' counted apart."""
    import pandas as pd

    run_dir = write_run(tmp_path, backends=("naive", "sdpa-flash"), seqs=(128, 256), dtypes=("fp32",),
                        masks=("none",), perf=False, semantics=False)
    df = pd.read_csv(run_dir / "results.csv")
    fwd = df[df.phase == "fwd"]
    probes = fwd.assign(case_id="edge:overflow:" + fwd.case_id, status="fail", reason="planted")
    pd.concat([df, probes]).to_csv(run_dir / "results.csv", index=False)
    head = headline(load_run(run_dir)).set_index("backend")
    assert head.loc["naive", "cases"] == 2 and head.loc["naive", "passed"] == 2 and head.loc["naive", "failed"] == 0
    assert head.loc["naive", "probe cases"] == 2 and head.loc["naive", "probe cases failed"] == 2


def test_a_fuzz_run_has_a_fuzz_section_with_each_failure_at_its_smallest_and_its_command(run_dir):
    from harness.report.document import report_blocks, to_markdown
    run = load_run(run_dir)
    run.env["fuzz"] = {"seed": 3, "budget_s": 60.0, "drawn": 140, "run": 52, "estimated_s": 59.5, "check_s": 60.3,
                       "shrink_s": 12.0, "shrink_bound_s": 120.0, "unshrunk": 0, "failures": [
                           {"backend": "mine", "check": "fail [fwd] out", "case": "fp32-b1-h3kv1-s1x2-d8-none",
                            "drawn_cases": 9, "steps": ["fp32", "seq_k 300 -> 2"],
                            "repro": "python -m harness check --backends mine --case 'fp32-b1-h3kv1-s1x2-d8-none' "
                                     "--seed 3 --device cpu"}]}
    text = to_markdown(report_blocks(run, {}), run_dir)
    fuzz = text.split("## Fuzz")[1].split("\n## ")[0]
    assert "Seed 3: 52 of 140 drawn cases run within the 60 s budget" in fuzz and "1 distinct failures" in fuzz
    assert "fp32-b1-h3kv1-s1x2-d8-none" in fuzz and "--case 'fp32-b1-h3kv1-s1x2-d8-none' --seed 3" in fuzz
