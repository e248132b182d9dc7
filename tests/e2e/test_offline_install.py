"""`bash setup.sh --offline DIR` installs the harness from a wheelhouse with no package index (`pip install
--no-index`), into a fresh venv that keeps the calling python's torch. The wheelhouse is made here from the
checkout (`pip wheel --no-deps --no-build-isolation`), so the test needs no network."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli.node.wheelhouse import manifest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def test_setup_offline_installs_from_the_wheelhouse_and_keeps_torch(tmp_path):
    # setup.sh installs the 'slurm' extra and checks that it is met: the calling python must have submitit
    pytest.importorskip("submitit", reason="submitit (the optional 'slurm' extra setup.sh installs) is not installed")
    house = tmp_path / "wheelhouse"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--wheel-dir",
                    str(house), str(ROOT)], check=True, capture_output=True, timeout=300)
    (house / "manifest.json").write_text(str(manifest(house)).replace("'", '"'))
    venv = tmp_path / "venv"
    # no index at all: an index URL that cannot answer, in case --no-index were dropped
    env = {**os.environ, "PYTHON": sys.executable, "VENV": str(venv), "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
           "PIP_EXTRA_INDEX_URL": ""}
    res = subprocess.run(["bash", str(ROOT / "setup.sh"), "--offline", str(house)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert f"setup.sh: keeping the torch of {sys.executable}" in res.stdout and "backends on cpu:" in res.stdout
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import harness, torch; print(harness.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr[-2000:]
    assert where.stdout.strip().startswith(str(venv))  # the wheel's copy, not the checkout's
