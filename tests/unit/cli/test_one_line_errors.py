"""What a user gets wrong gets one clear line (issue 35 item 5 and 6): a plugin that calls sys.exit at import, a
config's zero head_dim, a results path with a space in the printed report command, an unknown backend that is no
built-in, and check's help offering only flags check takes."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from harness.backends.registry import get_backends

from harness.isolation.plugin_host import load_backend_module
from harness.cli.main import main
from harness.cases.presets import from_hf_config

ROOT = Path(__file__).resolve().parents[3]


def _exiting_plugin(tmp_path) -> Path:
    path = tmp_path / "exits_at_import.py"
    path.write_text("import sys\nsys.exit(3)\n")
    return path


def test_a_plugin_that_calls_sys_exit_at_import_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match=r"exits_at_import.py' called sys.exit\(3\) while being imported"):
        load_backend_module(str(_exiting_plugin(tmp_path)))


def test_check_with_a_plugin_that_exits_says_so_in_one_line(tmp_path, capsys):
    code = main(["check", "--backend-module", str(_exiting_plugin(tmp_path)), "--results-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "called sys.exit(3) while being imported" in err[0], err


def test_pytest_suites_with_a_plugin_that_exits_is_a_usage_error_not_an_internalerror(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pytest", "suites", "-p", "no:cacheprovider", "-q",
                          "--backend-module", str(_exiting_plugin(tmp_path)), "--results-dir", str(tmp_path / "r")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert "INTERNALERROR" not in out and res.returncode == pytest.ExitCode.USAGE_ERROR, out[-2000:]
    assert "called sys.exit(3) while being imported" in res.stderr


@pytest.mark.parametrize("field", ["head_dim", "v_head_dim"])
def test_a_zero_head_dim_in_a_config_is_refused_not_derived(tmp_path, field):
    config = {"num_attention_heads": 8, "hidden_size": 512, "head_dim": 0}
    if field == "v_head_dim":
        config = {"num_attention_heads": 8, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 0}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"config.json: {field}=0: must be an integer >= 1"):
        from_hf_config(path)


def test_an_unknown_backend_points_at_backend_module(monkeypatch):
    from harness.backends import registry

    monkeypatch.setattr(registry, "_LOADED", [])  # no plugin module loaded (earlier tests load some)
    # a name no test registers (the README's my-attn is, in a whole run)
    with pytest.raises(ValueError, match=r"unknown backend .my-own-attn.; allowed: naive.*--backend-module my_attn"):
        get_backends("my-own-attn")


def test_check_help_offers_no_seq_k(capsys):
    assert main(["check", "--help"]) == 0
    assert "--seq-k" not in capsys.readouterr().out
    assert main(["check", "--seq-k", "8"]) == 2  # and check takes none


def test_the_report_command_check_prints_is_shell_quoted(tmp_path, capsys):
    results = tmp_path / "my results"
    assert main(["check", "--backends", "naive", "--no-isolate", "--preset", "llama-3-8b", "--batch", "1",
                 "--seq", "16", "--results-dir", str(results)]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("results: "))
    command = shlex.split(line.split("(", 1)[1].removesuffix(" draws it)"))
    assert command[:4] == ["python", "-m", "harness", "report"] and Path(command[4]).parent == results


@pytest.mark.parametrize("argv, says", [
    (["--case", "fp32-b2-h4-s64-d32-causl"], "mask at character 19 ('causl')"),
    (["--case", "fp32-b2-h4-s64-d32-none", "--fuzz"], "--case and --fuzz both choose the cases; give one"),
    (["--fuzz", "--matrix", "default"], "--matrix default and --fuzz both choose the cases; give one"),
])
def test_check_with_a_bad_case_or_two_case_choices_says_so_in_one_line(tmp_path, capsys, argv, says):
    code = main(["check", "--backends", "naive", "--results-dir", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and says in err[0], err
