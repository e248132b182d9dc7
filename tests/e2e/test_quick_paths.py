"""The quick paths test what defines a model (issue 34): `check`'s smoke matrix has rows that see no key and a
window that bites, in fp32 and bf16, and `check --preset` scales a model's window to the check's length, so a
window off-by-one or NaN on fully masked rows fails them (they passed with exit 0 before)."""

from __future__ import annotations

from pathlib import Path

import harness
from harness.isolation.plugin_host import load_backend_module
from harness.cli.main import main

#: loaded as the CLI loads it (one module identity for the registry, whichever test runs first)
PLUGIN = str(Path(__file__).resolve().parents[1] / "fixtures" / "model_defining_backends.py")


def _failing(df) -> set[str]:
    return set(df[df.status == "fail"].case_id)


def test_a_window_off_by_one_fails_check_and_check_preset_mistral():
    load_backend_module(PLUGIN)
    smoke = harness.check(["window-off-by-one"], "smoke", "cpu")
    # exactly the window cases (fp32, and bf16 with GQA) fail; every other smoke case passes
    assert _failing(smoke) == {"fp32-b2-h4-s161-d32-window8-0", "bf16-b2-h4kv2-s161-d32-window8-0"}
    assert set(smoke[~smoke.case_id.str.contains("window")].status) == {"pass"}
    mistral = harness.check(["window-off-by-one"], preset="mistral-7b", device="cpu")
    assert _failing(mistral) == set(mistral.case_id)  # prefill fp32/bf16 and the decode step
    assert all("-scaled-from4096" in c for c in mistral.case_id)


def test_check_preset_mistral_exits_1_on_a_window_off_by_one(tmp_path, capsys):
    code = main(["check", "--backend-module", PLUGIN, "--backends", "window-off-by-one", "--preset", "mistral-7b",
                 "--no-isolate", "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1 and "FAIL window-off-by-one fp32-b1-h32kv8-s201-d128-window50-0-scaled-from4096 [fwd]" in out


def test_nan_on_fully_masked_rows_fails_check():
    load_backend_module(PLUGIN)
    smoke = harness.check(["nan-on-empty-rows"], "smoke", "cpu")
    failing = smoke[smoke.status == "fail"]
    assert set(failing.case_id) == {"fp32-b2-h4-s17x33-d32-keypad0_20", "bf16-b2-h4-s17x33-d32-keypad0_20"}
    assert failing.reason.str.contains("NaN").all()
    assert set(smoke[~smoke.case_id.str.contains("keypad")].status) == {"pass"}
