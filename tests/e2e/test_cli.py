"""`python -m harness check` exit codes and bad-input errors, run as a user would (a subprocess)."""

import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
BROKEN = str(ROOT / "tests" / "fixtures" / "broken_backends.py")


def harness(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_check_passes_for_correct_backends(tmp_path):
    res = harness("check", "--backends", "naive,sdpa-math,sdpa-efficient", "--matrix", "smoke", "--device", "cpu",
                  "--results-dir", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    csv = next(tmp_path.glob("*/results.csv"))
    df = pd.read_csv(csv)
    assert set(df.status) == {"pass", "unavailable"}  # efficient is CUDA-only: skipped with a reason, exit 0
    assert df[df.status == "unavailable"].reason.str.contains("CUDA-only").all()


def test_check_of_a_model_preset_writes_a_run_folder_by_default(tmp_path):
    res = harness("check", "--preset", "llama-3-8b", "--seq", "32", "--batch", "1", "--backends", "naive",
                  "--device", "cpu", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    run = next((tmp_path / "results").glob("*/results.csv")).parent  # ./results/<run_id>/, as the suites write
    assert f"results: results/{run.name}/results.csv" in res.stdout
    assert set(pd.read_csv(run / "results.csv").case_id) == {
        "fp32-b1-h32kv8-s32-d128-causal", "bf16-b1-h32kv8-s32-d128-causal", "bf16-b1-h32kv8-s1x32-d128-causal-br"}
    res = harness("check", "--preset", "llama-3-8b", "--matrix", "default", cwd=tmp_path)
    assert res.returncode == 2 and "--matrix default and --preset/--hf-config both choose the cases" in res.stderr


def test_check_fails_for_a_broken_plugin(tmp_path):
    res = harness("check", "--backend-module", BROKEN, "--backends", "broken-scale", "--matrix", "smoke",
                  cwd=tmp_path)
    assert res.returncode == 1
    assert "FAIL broken-scale" in res.stdout


def test_unknown_names_are_one_line_errors():
    for args, needle in [
        (["--backends", "nope"], "unknown backend 'nope'; allowed: naive"),
        (["--matrix", "huge"], "unknown matrix 'huge'; allowed: auto, smoke, default, full"),
        (["--device", "tpu"], "device 'tpu'"),
        (["--backend-module", "no_such_module_xyz"], "--backend-module 'no_such_module_xyz' failed to import"),
        (["--backend-module", "missing/file.py"], "no such file"),
    ]:
        res = harness("check", *args)
        assert res.returncode == 2, (args, res.stderr)
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and needle in errors[0], res.stderr


def test_a_missing_file_is_refused_before_the_heavy_imports():
    """issue 67 item 6: a bad path took 12-22 s to refuse under load (torch and the backends imported first); now
    no torch is imported before the refusal - checked by what the process imported, not by a clock."""
    probe = ("import sys; from harness.cli.main import main; code = main({argv}); "
             "print('TORCH' if 'torch' in sys.modules else 'LIGHT', code)")
    for argv, words in ((["check", "--backend-module", "missing/file.py", "--backends", "x"], "no such file"),
                        (["recommend", "--workload", "missing.toml"], "no such file"),
                        (["check", "--hf-config=missing/config.json"], "no such file"),
                        # and names (cli/early.py reads them from the defining modules' source)
                        (["check", "--preset", "llama-3-9b"], "unknown preset 'llama-3-9b'; allowed: llama-3-8b, "),
                        (["check", "--matrix=smok"], "unknown matrix 'smok'; allowed: auto, smoke, "),
                        (["check", "--backends", "naive,sdpa-fast"], "unknown backend 'sdpa-fast'; allowed: naive, ")):
        res = subprocess.run([sys.executable, "-c", probe.format(argv=argv)], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        assert res.stdout.split() == ["LIGHT", "2"] and words in res.stderr, (argv, res.stdout, res.stderr)


def test_the_early_refusal_knows_exactly_the_names_the_commands_do():
    """cli/early.py reads the presets, matrices and built-in backends from their modules' source; they must be the
    names the imported definitions give, and its messages the ones the commands give."""
    from harness.backends.registry import built_in_names
    from harness.cli import early
    from harness.cases.matrices import AUTO, FUZZ, MATRICES
    from harness.cases.presets import PRESETS

    assert early.preset_names() == tuple(PRESETS)
    assert early.matrix_names() == (AUTO, *MATRICES, FUZZ)
    assert early.builtin_backend_names() == built_in_names()
    # the commands' own messages, from a process with no plugin registered
    slow = ("from harness.cases.presets import get_preset; from harness.cases.matrices import resolve_matrix\n"
            "from harness.backends.registry import get_backends\n"
            "for f in (lambda: get_preset('nope'), lambda: resolve_matrix('nope', 'cpu'),\n"
            "          lambda: get_backends('nope')):\n"
            "    try:\n        f()\n    except ValueError as e:\n        print(e)\n")
    messages = subprocess.run([sys.executable, "-c", slow], cwd=ROOT, capture_output=True, text=True,
                              timeout=300).stdout.splitlines()
    early_ones = [early.refusal(["check", flag, "nope"]) for flag in ("--preset", "--matrix", "--backends")]
    assert early_ones == messages
    # a plugin may register any name; a command without the flag gets argparse's own error
    assert early.refusal(["check", "--backends", "mine", "--backend-module", __file__]) == ""
    assert early.refusal(["history", "--matrix", "nope"]) == ""


def test_plugin_that_raises_becomes_an_error_row(tmp_path):
    plugin = tmp_path / "raising.py"
    plugin.write_text(
        "from harness import Backend, register\n"
        "@register\n"
        "class Raising(Backend):\n"
        "    name = 'raising'\n"
        "    def forward(self, q, k, v, *, mask, scale):\n"
        "        raise RuntimeError('kernel exploded')\n")
    res = harness("check", "--backend-module", str(plugin), "--backends", "raising,naive", "--matrix", "smoke",
                  cwd=tmp_path)
    assert res.returncode == 1
    assert "ERROR raising" in res.stdout and "RuntimeError: kernel exploded" in res.stdout
    assert "naive" in res.stdout  # the sweep went on


def test_recommend_a_model_preset_states_its_cost_or_runs(monkeypatch, capsys):
    # Llama-3-8B at 8k x 4 training, at injected rates (a CPU without bf16 units: ~1 GFLOP/s bf16 matmul, 40
    # GFLOP/s float64 reference): refused with the figures. The rates are injected so that the verdict does not
    # depend on this machine's speed (a CPU with AMX measures ~1 TFLOP/s bf16 and would run it)
    import harness.planning.cost as cost
    from harness.cli.main import main

    monkeypatch.setattr(cost, "reference_rate", lambda device: 40e9)
    monkeypatch.setattr(cost, "baseline_rate", lambda device, dtype: 1e9)
    assert main(["recommend", "--preset", "llama-3-8b", "--seq", "8192", "--batch", "4", "--training",
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "bf16-b4-h32kv8-s8192-d128-causal" in err and "--allow-expensive" in err
    # the whole job (issue 48): the reference and baseline, then every backend's calls and timing rounds
    assert "the whole job would take ~" in err and "reference and baseline ~3.8 h, correctness calls ~" in err
    assert "timing rounds ~" in err and "deployment checks ~" in err
    # a preset whose cost is small runs end to end; the preset fixes heads, kv heads, head dim and mask
    res = harness("recommend", "--preset", "vit-l", "--seq", "197", "--batch", "2", "--dtype", "fp32",
                  "--backends", "naive,sdpa-math", "--no-checks", "--device", "cpu")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "fp32-b2-h16-s197-d64-none" in res.stdout and "winner:" in res.stdout
    # what the user reads is only ours: no profiler (USDT) lines, no xformers load warning
    assert "USDT" not in res.stdout + res.stderr and "can't load C++/CUDA" not in res.stdout + res.stderr
    res = harness("recommend", "--preset", "vit-l", "--seq", "197", "--batch", "2", "--heads", "8")
    assert res.returncode == 2 and "vit-l sets heads, kv heads, head dim and mask; drop --heads" in res.stderr


def test_suites_refuse_an_expensive_preset_before_running():
    # the rates are injected (tests/fixtures/cost_rates.py), as in the recommend refusal above: on a host with bf16
    # units the measured estimate came under the hour and the suite ran for its whole 600 s timeout (issue 35)
    res = subprocess.run([sys.executable, "-m", "pytest", "suites", "--preset", "llama-3-8b", "-p", "no:cacheprovider",
                          "-p", "tests.fixtures.cost_rates", "-q"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 4 and "--allow-expensive" in res.stderr and "Traceback" not in res.stderr
    # injected rates; the preset's cases include its serving step (issue 36), the most expensive one
    assert "reference and baseline ~16.3 h, correctness calls ~" in res.stderr, res.stderr[-2000:]


def test_suites_with_k_refuse_on_the_selected_tests_cases():
    """With -k the refusal waits for collection and estimates the selected tests' cases, not the whole preset's."""
    res = subprocess.run([sys.executable, "-m", "pytest", "suites", "--preset", "llama-3-8b", "-p", "no:cacheprovider",
                          "-p", "tests.fixtures.cost_rates", "-q", "-k", "s8192-d128"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 4 and "--allow-expensive" in out and "Traceback" not in out, out[-2000:]
    # the longest step is the selected case's; the whole preset's would be its s16384 case's (and its memory refusal)
    assert "the longest step, bf16-b2-h32kv8-s8192-d128-causal" in out and "s16384" not in out, out[-2000:]


def test_recommend_refuses_huge_shapes_with_figures_not_a_traceback():
    for shape, needle in ((["--seq", "1000000", "--head-dim", "128"], "needs ~"),
                          (["--seq", "128", "--head-dim", "1000000"], "needs ~")):
        res = harness("recommend", "--batch", "1", "--heads", "8", "--dtype", "fp32", "--device", "cpu", *shape)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert needle in res.stderr and "--allow-expensive" in res.stderr


def test_check_of_a_model_preset_bites_off_the_tile(tmp_path):
    """issue 67 item 1: a tiled kernel that drops its last partial block of keys past 128 (tests/fixtures/
    dropped_tail.py) passed `check --preset` when every case was 128 tokens; the default cases now include a
    prefill and a decode over 201 keys (no multiple of any tile, past 128), which it fails, while its 128-token case
    (whole tiles) still passes."""
    res = harness("check", "--preset", "llama-3-8b", "--backend-module", str(ROOT / "tests" / "fixtures" /
                                                                              "dropped_tail.py"),
                  "--backends", "dropped-tail", "--device", "cpu", "--results-dir", str(tmp_path))
    assert res.returncode == 1, res.stdout + res.stderr
    df = pd.read_csv(next(tmp_path.glob("*/results.csv")))
    worst = df.groupby("case_id").status.agg(lambda s: "fail" if (s == "fail").any() else "pass").to_dict()
    assert worst == {"fp32-b1-h32kv8-s201-d128-causal": "fail", "bf16-b2-h32kv8-s128-d128-causal": "pass",
                     "bf16-b2-h32kv8-s1x201-d128-causal-br": "fail"}, worst


def test_check_of_the_smoke_matrix_bites_off_the_tile(tmp_path):
    """issue 67 item 1: plain `check` (the smoke matrix) fails the same kernel on its 161-token cases, prefill and
    decode, and passes it on the short ones."""
    res = harness("check", "--backend-module", str(ROOT / "tests" / "fixtures" / "dropped_tail.py"),
                  "--backends", "dropped-tail", "--device", "cpu", "--results-dir", str(tmp_path))
    assert res.returncode == 1, res.stdout + res.stderr
    df = pd.read_csv(next(tmp_path.glob("*/results.csv")))
    failing = set(df[df.status == "fail"].case_id)
    assert "bf16-b2-h4kv2-s1x161-d32-causal-br" in failing and "fp32-b2-h4-s161-d32-none" in failing, failing
    assert not any("s17x33" in c for c in failing), failing
