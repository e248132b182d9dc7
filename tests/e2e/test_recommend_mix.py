"""issue 66, end to end: `recommend --workload FILE --format json` with a traffic mix - the weights change the overall
pick, prefill and decode are picked apart, and each framework's advice names a setting (tests/fixtures/mix_backends.py:
quick-prefill sleeps on decode steps, quick-decode on prefill)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = str(ROOT / "tests" / "fixtures" / "mix_backends.py")

pytestmark = pytest.mark.e2e


def _recommend(tmp_path, prefill_weight: int, decode_weight: int) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"mix-{prefill_weight}-{decode_weight}.toml"
    path.write_text(f'[defaults]\nheads = 2\nhead_dim = 16\ndtype = "fp32"\n\n'
                    f'[[shape]]\nname = "prefill"\nbatch = 1\nseq = 64\nweight = {prefill_weight}\n\n'
                    f'[[shape]]\nname = "decode"\nbatch = 4\nseq_q = 1\nseq_k = 64\nmask = "causal-br"\n'
                    f'weight = {decode_weight}\n')
    res = subprocess.run([sys.executable, "-m", "harness", "recommend", "--workload", str(path), "--backend-module",
                          PLUGIN, "--backends", "quick-prefill,quick-decode", "--no-checks", "--timing-budget-ms",
                          "40", "--device", "cpu", "--format", "json", "--for", "transformers", "--results-dir",
                          str(tmp_path / "results")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)


def test_the_weights_of_a_traffic_mix_change_the_overall_pick(tmp_path):
    """Two runs of the same file but its weights; the second's run folder is read back (issue 66 item 4, issue 67
    item 7): what was measured (results.csv, samples.csv), the advice as data (advice.json: what --format json
    printed) and as printed (advice.txt), which `report` shows in an Advisor section."""
    prefill_heavy, decode_heavy = _recommend(tmp_path / "p", 100, 1), _recommend(tmp_path / "d", 1, 100)
    assert prefill_heavy["overall_by"] == "weighted time"
    assert prefill_heavy["winner"] == "quick-prefill", prefill_heavy["mix"]
    assert decode_heavy["winner"] == "quick-decode", (decode_heavy["mix"], [
        (w["label"], [(r["backend"], r["status"], r["reason"]) for r in w["table"]]) for w in decode_heavy["workloads"]])
    for result in (prefill_heavy, decode_heavy):
        parts = result["mix"]["parts"]
        assert parts["prefill"]["winner"] == "quick-prefill" and parts["decode"]["winner"] == "quick-decode", [
            (w["label"], [(r["backend"], r["status"], r["reason"], r["latency_ms"]) for r in w["table"]])
            for w in result["workloads"]]
        assert result["mix"]["split"] is True
        assert {f["framework"] for f in result["frameworks"]} == {"vllm", "sglang", "transformers"}
        advice = {f["framework"]: f for f in result["frameworks"]}
        # a plugin's own declared setting (vLLM CUSTOM, quick-decode), passed from its process as data; quick-prefill
        # declares none, so vLLM's pick is quick-decode whatever the mix; no SGLang or transformers setting is made up
        assert advice["vllm"]["pick"] == "quick-decode" and advice["vllm"]["setting"] == "CUSTOM"
        assert advice["vllm"]["settings"][0].startswith("vllm serve MODEL --attention-backend CUSTOM")
        assert advice["sglang"]["settings"] == [] and advice["transformers"]["settings"] == []
    run = next((tmp_path / "d" / "results").iterdir())
    assert json.loads((run / "advice.json").read_text()) == decode_heavy
    text = (run / "advice.txt").read_text()
    assert "traffic mix" in text and "vllm would choose CPU_ATTN" in text
    assert "for transformers: nothing to set" in text
    results = (run / "results.csv").read_text()
    assert "quick-prefill" in results and "quick-decode" in results and (run / "samples.csv").stat().st_size > 100
    res = subprocess.run([sys.executable, "-m", "harness", "report", str(run)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    report = (run / "report.md").read_text()
    assert "## Advisor" in report and "for transformers: nothing to set" in report
