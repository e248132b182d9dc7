"""A long `pytest suites` run says where it is (issue 35: the main job ran past 20 minutes under load with only
pytest's dots): the stage, tests done of all and of the stage, time elapsed and left (advisor.progress, weighted
by the cost model), as recommend does. Printed every 30 s; here after every test (tests/fixtures/
progress_every_test.py) so one short run shows it."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^attention harness: \[(\d+)/(\d+)\] (\w+) stage, (\d+)/(\d+) of its tests; \d+ s elapsed, "
                  r"(~\d+ s left|done)$")


def test_pytest_suites_prints_its_progress_with_the_time_left(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pytest", "suites/correctness", "-p", "no:cacheprovider", "-q",
                          "-p", "tests.fixtures.progress_every_test", "--matrix", "smoke", "--backends", "naive",
                          "--no-isolate", "--no-report", "--results-dir", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    lines = [m for m in map(LINE.match, res.stdout.splitlines()) if m]
    assert lines, res.stdout[-3000:]
    total = int(lines[0][2])
    assert [int(m[1]) for m in lines] == list(range(1, total + 1))  # every test counted, in order
    assert {m[3] for m in lines} == {"correctness"} and lines[-1][6] == "done"
    assert all(m[6].startswith("~") for m in lines[:-1])
