"""Issue 50's "same answers on real runs": make N real smoke runs (the second half with a slower backend, so the
history has a real step), then check that the history index answers `history`, `--changes` and `--noise` as the CSV
path does on them.

    .venv/bin/python benchmarks/history_real_runs.py make --runs 50 --out /tmp/real-history
    .venv/bin/python benchmarks/history_real_runs.py compare --out /tmp/real-history

`make` runs `pytest suites --benchmark` on two smoke cases with naive, sdpa and the tunable backend of
tests/fixtures/slow_backends.py (HARNESS_SLOWDOWN=0.5 from the middle run on: 1.5x on its keys); each run is a real
run folder. `compare` prints what each path found and exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
CASES = "fp32-b2-h4-s161-d32-causal or fp32-b2-h4-s17x33-d32-none"


def make(out: Path, runs: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    done = len([p for p in out.iterdir() if (p / "results.csv").exists()])
    for i in range(done, runs):
        env = {**os.environ, "HARNESS_SLOWDOWN": "0.5" if i >= runs // 2 else "0"}
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "suites", "--matrix", "smoke", "--benchmark", "--backend-module",
             "tests/fixtures/slow_backends.py", "--backends", "naive,sdpa,sdpa-math-tunable", "--rounds", "3",
             "--timing-budget-ms", "60", "--results-dir", str(out), "-q", "-p", "no:cacheprovider", "--no-report",
             "--benchmark-quiet", "-k", CASES], cwd=ROOT, env=env, capture_output=True, text=True)
        print(f"run {i + 1}/{runs}: exit {proc.returncode}, {time.monotonic() - start:.0f} s, "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
        if proc.returncode not in (0, 1):
            sys.exit(proc.stdout[-2000:] + proc.stderr[-2000:])


def _noise(frame: pd.DataFrame, testbed: str, where: Path, rounds=None) -> dict:
    from harness.history.noise import build_noise_model
    path = build_noise_model(frame, testbed, where, rounds) if rounds is not None else \
        build_noise_model(frame, testbed, where)
    return {k: v for k, v in json.loads(path.read_text()).items() if k != "built"}


def answers_from_csvs(root: Path, scratch: Path) -> dict:
    from harness.history.changes import detect_changes
    from harness.history.stored import history_text, load_history
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        h = load_history(root)
    timed = h[pd.to_numeric(h.latency_ms, errors="coerce") > 0]
    return {"text": history_text(h), "warnings": sorted({str(w.message) for w in said}),
            "changes": detect_changes(timed),
            "noise": {tb: _noise(h, tb, scratch / "csv-noise") for tb in sorted(h.testbed_id.unique())}}


def answers_from_index(root: Path, scratch: Path) -> dict:
    from harness.history.changes import detect_changes
    from harness.history.stored import summary_text
    from harness.history.index import CHANGE_COLUMNS, CODE_COLUMNS, open_index
    from harness.store.schema import KEY
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ix = open_index(root, str(scratch / "index"))
        out = {"text": summary_text(ix.summary(), ix.notes()),
               "changes": detect_changes(ix.rows(CHANGE_COLUMNS, timed=True)),
               "noise": {tb: _noise(ix.rows(("run_id", "testbed_id", *KEY, *CODE_COLUMNS), testbed=tb), tb,
                                    scratch / "ix-noise", ix.rounds(tb)) for tb in ix.testbeds()}}
    out["warnings"] = sorted({str(w.message) for w in said})
    return out


def compare(root: Path) -> int:
    scratch = Path(root.parent / f"{root.name}-answers")
    shutil.rmtree(scratch, ignore_errors=True)
    start = time.monotonic()
    csv = answers_from_csvs(root, scratch)
    mid = time.monotonic()
    index = answers_from_index(root, scratch)
    end = time.monotonic()
    runs = len([p for p in root.iterdir() if (p / "results.csv").exists()])
    changed = csv["changes"]
    print(f"{runs} runs; CSV path {mid - start:.1f} s, index (first use, ingest included) {end - mid:.1f} s")
    print(f"change points (CSV path): {len(changed)} key(s): "
          f"{sorted(set(changed.backend)) if len(changed) else []}, at runs {sorted(set(changed.at_run))}")
    models = ", ".join(f"{tb}: {len(m['keys'])} keys" for tb, m in csv["noise"].items())
    print(f"noise models: {models}")
    same = {"history table": csv["text"] == index["text"], "warnings": csv["warnings"] == index["warnings"],
            "change points": changed.astype(str).reset_index(drop=True).equals(
                index["changes"].astype(str).reset_index(drop=True)),
            "noise models": csv["noise"] == index["noise"]}
    for what, ok in same.items():
        print(f"{what}: {'same' if ok else 'DIFFERENT'}")
    return 0 if all(same.values()) else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("step", choices=("make", "compare"))
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--out", type=Path, default=Path("/tmp/real-history"))
    args = p.parse_args()
    if args.step == "make":
        make(args.out, args.runs)
        return 0
    return compare(args.out)


if __name__ == "__main__":
    sys.exit(main())
