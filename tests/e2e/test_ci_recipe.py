"""docs/regressions.md's CI recipe, its lines run as written (bash, one environment: this test's python) in a clone
of this checkout with a worktree of the base commit beside it: unchanged code passes the gate (exit 0) and a new
commit whose backend does its work twice fails it (exit 1). Each `pytest suites` line runs one smoke case of the
tunable backend only (appended options, as tests/e2e/test_readme.py's SMALLER), to keep CI's time. On a loaded
machine the gate may answer 'undecided' (exit 3), as documented; it must never give the other verdict."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: appended to each `python -m pytest suites` line of the recipe: one case of the tunable backend, two rounds
SMALLER = ("--backend-module tests/fixtures/slow_backends.py --backends sdpa-math-tunable --matrix smoke "
           "-k 'fp32-b2-h4-s161-d32-none and not fidelity' --rounds 2 --timing-budget-ms 40 --no-report "
           "-p no:cacheprovider -q")


def recipe() -> list[str]:
    """The bash lines of the CI recipe block in docs/regressions.md, without their comments."""
    text = (ROOT / "docs" / "regressions.md").read_text()
    block = re.search(r"\*\*CI recipe\*\*.*?```bash\n(.*?)```", text, flags=re.S).group(1)
    return [re.split(r"\s{2,}#", line)[0].strip() for line in block.splitlines() if line.strip()]


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def _run_recipe(new: Path, base: str) -> subprocess.CompletedProcess:
    """The recipe in `new` (a clone), BASE=`base`; `<base-run>`/`<new-run>`: the run folders in the order made."""
    lines = [line.replace("pytest suites --benchmark", f"pytest suites --benchmark {SMALLER}") for line in recipe()]
    *runs, gate = lines
    script = "\n".join(["set -e", f"BASE={shlex.quote(base)}", *runs,
                        'RUNS=($(ls -d "$R"/*/ | sort))',
                        gate.replace("<base-run>", "$(basename ${RUNS[0]})").replace("<new-run>",
                                                                                    "$(basename ${RUNS[1]})")])
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # `python`: this one
    env.pop("PYTHONPATH", None)
    return subprocess.run(["bash", "-c", script], cwd=new, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.e2e
@pytest.mark.parametrize("slower", [False, True], ids=["unchanged-exits-0", "twice-the-work-exits-1"])
def test_the_ci_recipe_as_written(tmp_path, slower):
    new = tmp_path / "new"
    _git("clone", "-q", str(ROOT), str(new), cwd=tmp_path)
    _git("config", "user.email", "ci@example.invalid", cwd=new)
    _git("config", "user.name", "ci", cwd=new)
    if slower:  # the new commit: the tunable backend does the whole attention twice by default
        fixture = new / "tests" / "fixtures" / "slow_backends.py"
        fixture.write_text(fixture.read_text().replace('os.environ.get("HARNESS_REPEAT", "1")',
                                                       'os.environ.get("HARNESS_REPEAT", "2")'))
    _git("commit", "-q", "--allow-empty", "-am", "the new commit", cwd=new)
    res = _run_recipe(new, "HEAD~1")
    out = res.stdout + res.stderr
    # the gate's own word on a loaded machine (a run's or the re-measurement's load average above the CPU count) is
    # 'undecided' (exit 3), never the wrong answer: this test holds on a busy VM and still fails a wrong verdict
    loaded = "load average" in out
    expected = {1 if slower else 0} | ({3} if loaded else set())
    assert res.returncode in expected, out[-4000:]
    runs = sorted(p for p in (new / "results").iterdir() if p.is_dir())
    assert len(runs) == 2 and "Traceback" not in out
    if slower:
        assert "REGRESSION" in out and "slower" in out
