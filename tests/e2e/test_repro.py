"""A failing row's repro command reruns it: `check --case ID --seed S` fails the same check (exit 1) and the same
command on an honest backend passes (exit 0); `check --fuzz` prints each failure's command, which reproduces it.
Run in this process (harness.cli.main.main, the command's own entry point) to spare an interpreter start each."""

import shlex
from pathlib import Path

import pandas as pd
import pytest

from harness.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
PLANTED = str(ROOT / "tests" / "fixtures" / "planted_geometry.py")
PREFIX = "python -m harness "


def run(capsys, argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().out


def rerun(capsys, command: str, tmp_path, backend: str | None = None) -> tuple[int, str]:
    argv = shlex.split(command.removeprefix(PREFIX)) + ["--results-dir", str(tmp_path)]
    if backend is not None:
        argv[argv.index("--backends") + 1] = backend
    return run(capsys, argv)


@pytest.mark.e2e
def test_a_failing_rows_command_reproduces_it_and_passes_on_an_honest_backend(capsys, tmp_path):
    case = "fp32-b1-h6kv2-s5x9-d16-causal-br"            # GQA group 3 and a single sequence: two planted bugs
    code, out = run(capsys, ["check", "--backend-module", PLANTED, "--backends", "planted-geometry", "--case", case,
                             "--seed", "5", "--device", "cpu", "--results-dir", str(tmp_path / "a")])
    assert code == 1 and f"FAIL planted-geometry {case} [fwd]" in out
    command = next(line.split("rerun: ")[1] for line in out.splitlines() if "rerun: " in line)
    assert command == (f"python -m harness check --backend-module {PLANTED} --backends planted-geometry "
                       f"--case '{case}' --seed 5 --device cpu")
    rows = pd.read_csv(next((tmp_path / "a").glob("*/results.csv")))
    assert set(rows[rows.status == "fail"].repro) == {command} and rows[rows.status == "pass"].repro.isna().all()
    code, again = rerun(capsys, command, tmp_path / "b")
    assert code == 1 and f"FAIL planted-geometry {case} [fwd]" in again
    code, honest = rerun(capsys, command, tmp_path / "c", backend="planted-honest")
    assert code == 0 and "FAIL" not in honest


@pytest.mark.e2e
def test_fuzz_prints_each_failure_once_with_a_command_that_reproduces_it(capsys, tmp_path):
    code, out = run(capsys, ["check", "--backend-module", PLANTED, "--backends", "planted-geometry", "--fuzz",
                             "--fuzz-budget-s", "4", "--seed", "6", "--device", "cpu",
                             "--results-dir", str(tmp_path / "a")])
    assert code == 1 and "fuzz: seed 6, " in out and " drawn cases run within the 4 s budget" in out
    failures = [line for line in out.splitlines() if line.startswith("FUZZ FAIL planted-geometry ")]
    commands = [line.strip() for line in out.splitlines() if line.startswith("  " + PREFIX + "check")]
    assert failures and len(commands) == len(failures)
    case, phase = failures[0].split()[3:5]
    code, again = rerun(capsys, commands[0], tmp_path / "b")
    assert code == 1 and f"FAIL planted-geometry {case} {phase}" in again
    env = pd.read_json(next((tmp_path / "a").glob("*/env.json")), typ="series")
    assert env["fuzz"]["seed"] == 6 and env["fuzz"]["drawn"] >= env["fuzz"]["run"] >= 1 and env["fuzz"]["failures"]
    # issue 67 item 5: the summary's counts are results.csv's - its failing drawn cases, each under one failure
    rows = pd.read_csv(next((tmp_path / "a").glob("*/results.csv")))
    failing = rows[rows.status.isin(["fail", "error", "oom"])].drop_duplicates(["case_id", "backend"])
    assert env["fuzz"]["failing"] == len(failing), failing[["case_id", "backend", "phase", "status"]]
    assert all(f"of the {env['fuzz']['failing']} failing drawn case" in line for line in failures)
    assert all(f["drawn_cases"] <= env["fuzz"]["failing"] for f in env["fuzz"]["failures"])


@pytest.mark.e2e
def test_a_probe_s_failure_carries_the_command_that_reruns_it(tmp_path):
    """Issue 67 item 8: a failing probe row (here the edge-case probe's non-contiguous q, a planted bug) has in its
    repro column the pytest command that reruns that probe test alone on the run's inputs; run, it fails again."""
    import subprocess
    import sys

    module = str(ROOT / "tests" / "fixtures" / "noncontig_bug.py")
    first = subprocess.run([sys.executable, "-m", "pytest", "suites/probes/test_edge_cases.py", "-q", "-p",
                            "no:cacheprovider", "--backend-module", module, "--backends", "noncontig-bug",
                            "--matrix", "default", "-k", "noncontig and test_edge_case", "--device", "cpu",
                            "--results-dir", str(tmp_path / "a")], cwd=ROOT, capture_output=True, text=True)
    assert first.returncode == 1, first.stdout[-2000:]
    rows = pd.read_csv(next((tmp_path / "a").glob("*/results.csv")))
    failed = rows[rows.status == "fail"]
    assert len(failed) >= 1 and failed.repro.notna().all(), rows[["case_id", "status", "repro"]]
    command = failed.repro.iloc[0]
    assert command.startswith("python -m pytest 'suites/probes/test_edge_cases.py::test_edge_case[noncontig-bug-")
    assert f"--backend-module {module} --backends noncontig-bug --matrix default --seed " in command
    assert rows[rows.status == "pass"].repro.isna().all()
    again = subprocess.run(shlex.split(command.replace("python", sys.executable, 1))
                           + ["-p", "no:cacheprovider", "--results-dir", str(tmp_path / "b")],
                           cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 1 and "1 failed" in again.stdout, again.stdout[-2000:]
