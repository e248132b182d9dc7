"""Every command in README.md, run in a fresh folder with the README's own my_attn.py, so the README cannot
drift from the tool.

To keep CI time small, the `python -m harness` commands run in this process (`harness.cli.main.main`, the same
entry point: no interpreter and torch start-up each), and four commands run smaller than written, each
substitution listed in SMALLER: the suites command runs one smoke case (-k) with one timing round, the two
recommends time with a 20 ms budget and skip the deployment checks (fullgraph compiles cost ~20 s each on 2 cores),
and `check --fuzz` runs a 3 s budget from seed 0. The two commands of "Two commands" are not run
here: `pytest tests` is what CI runs (.ci/run), and `pytest suites --benchmark` is run on one smoke case, with
its summary checked, by tests/e2e/test_suites.py::test_the_harness_summary_is_the_last_thing_printed_and_explains_its_columns.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
TWO_COMMANDS = ["bash setup.sh && .venv/bin/pytest suites --benchmark", "bash setup.sh && .venv/bin/pytest tests"]
#: (a command's start, what is appended to it here, why)
SMALLER = [
    ("pytest suites --backend-module", ["-k", "fp32-b2-h4-s161-d32-none", "-p", "no:cacheprovider", "--rounds", "1"],
     "one smoke case, one timing round"),
    ("python -m harness recommend", ["--no-checks", "--timing-budget-ms", "20"], "no compile checks, 20 ms budget"),
    ("python -m harness check --backend-module my_attn.py --backends my-attn --fuzz", ["--fuzz-budget-s", "3",
                                                                                       "--seed", "0"],
     "a 3 s fuzz budget, seed 0"),
]


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def readme_commands() -> list[str]:
    """The README's shell commands, one per line of its bash blocks, without their trailing comments."""
    commands = []
    for block in _blocks("bash"):
        for line in block.splitlines():
            command = re.split(r"\s{2,}#", line)[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def plugin_source() -> str:
    return next(b for b in _blocks("python") if b.startswith("# my_attn.py"))


def test_the_two_commands_are_the_setup_and_the_test_command_ci_runs():
    assert readme_commands()[:2] == TWO_COMMANDS
    assert "pytest tests" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_is_a_newcomers_page_of_at_most_200_lines_and_its_links_resolve():
    assert len(README.splitlines()) <= 200
    for link in re.findall(r"\]\((docs/[^)#]+)\)", README):
        # docs/variants.md and docs/serving.md are written by the modifier and serving work, merged beside this
        assert (ROOT / link).is_file() or link in ("docs/variants.md", "docs/serving.md"), link


def _run(command: str, cwd: Path, plugin: Path, run_id: str | None, capsys=None) -> subprocess.CompletedProcess:
    """The command's exit code and output: `python -m harness ...` through main() when `capsys` is given (the
    caller has changed into `cwd`), otherwise as a subprocess."""
    args = shlex.split(command)
    for start, extra, _ in SMALLER:
        if command.startswith(start):
            args += extra
    args = [str(plugin) if a == "my_attn.py" else a for a in args]
    if run_id:
        args = [a.replace("RUN_ID", run_id) for a in args]
    if args[:3] == ["python", "-m", "harness"] and capsys is not None:
        from harness.cli.main import main

        capsys.readouterr()
        code = main(args[3:])
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, captured.out, captured.err)
    if args[0] == "python":
        args[0] = sys.executable
    elif args[0] == "pytest":  # the suites live in the checkout; their run folder goes to this test's folder
        args = [sys.executable, "-m", "pytest", *args[1:], "--results-dir", str(cwd / "results")]
        return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_every_readme_command_runs_as_documented(tmp_path, monkeypatch, capsys):
    from harness.backends.registry import _REGISTRY

    plugin = tmp_path / "my_attn.py"
    plugin.write_text(plugin_source())
    monkeypatch.chdir(tmp_path)
    run_id = None
    ran = []
    try:
        outcomes = []
        for command in readme_commands()[2:]:
            outcomes.append((command, _run(command, tmp_path, plugin, run_id, capsys)))
            found = re.search(r"results: results/([^/\s]+)/results.csv", outcomes[-1][1].stdout)
            if " check " in command and found:
                run_id = run_id or found.group(1)
    finally:
        _REGISTRY.pop("my-attn", None)  # the README's plugin, registered in this process
    for command, res in outcomes:
        out = res.stdout + res.stderr
        assert res.returncode == 0, f"{command}\n{out[-3000:]}"
        assert "Traceback" not in out, command
        ran.append(command.split()[:4])
    # what the README promises of each: check wrote a run folder, report drew it, recommend named a winner
    assert run_id and (tmp_path / "results" / run_id / "report.html").is_file()
    assert ["python", "-m", "harness", "backends"] in ran and ["python", "-m", "harness", "recommend"] in ran
