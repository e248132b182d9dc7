"""Issue 47's proof (b) in whole runs: do naive's and sdpa's latencies move when a plugin that slows the clock 5-fold
at import (tests/fixtures/clock_plugin.py) is loaded into the same run?

    .venv/bin/python benchmarks/clock_plugin_runs.py [--pairs 2] [--out /tmp/clock-plugin-runs]

Runs `pytest suites --benchmark --matrix smoke --seed 0`, alternating: without the plugin (naive, sdpa), then with it
(naive, sdpa and the plugin's two backends). Per naive/sdpa key: the ratio with/without of each pair, against the
ratio of two runs without it (the run-to-run spread). Before the trust boundary a run with the plugin gave 5.4x.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
KEY = ["case_id", "backend", "phase"]


def run(out: Path, plugin: bool) -> pd.DataFrame:
    before = set(out.glob("*")) if out.exists() else set()
    extra = ["--backend-module", "tests/fixtures/clock_plugin.py",
             "--backends", "naive,sdpa,gamed-clock-at-import,gamed-clock-in-forward"] if plugin else \
        ["--backends", "naive,sdpa"]
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "suites", "--matrix", "smoke", "--benchmark", "--seed", "0",
                           "--results-dir", str(out), "-q", "-p", "no:cacheprovider", "--no-report",
                           "--benchmark-quiet", *extra], cwd=ROOT, capture_output=True, text=True)
    (new,) = set(out.glob("*")) - before
    print(f"{'with' if plugin else 'without'} the plugin: exit {proc.returncode}, {time.monotonic() - start:.0f} s, "
          f"load {os.getloadavg()[0]:.1f}, {new.name}", flush=True)
    rows = pd.read_csv(new / "results.csv")
    rows = rows[rows.backend.isin(["naive", "sdpa"]) & (pd.to_numeric(rows.latency_ms, errors="coerce") > 0)]
    return rows.groupby(KEY).latency_ms.median()


def describe(ratios: pd.Series) -> str:
    q = np.quantile(ratios, [0.25, 0.5, 0.75])
    return f"median {q[1]:.3f} (quartiles {q[0]:.3f}-{q[2]:.3f}, {ratios.min():.3f}-{ratios.max():.3f}), " \
           f"{len(ratios)} keys"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("/tmp/clock-plugin-runs"))
    args = p.parse_args()
    without, with_ = [], []
    for _ in range(args.pairs):
        without.append(run(args.out, plugin=False))
        with_.append(run(args.out, plugin=True))
    for i in range(args.pairs):
        both = pd.concat([without[i], with_[i]], axis=1, keys=["without", "with"]).dropna()
        print(f"pair {i + 1}, with / without: {describe(both['with'] / both['without'])}")
    for i in range(args.pairs - 1):
        both = pd.concat([without[i], without[i + 1]], axis=1).dropna()
        print(f"without, run {i + 2} / run {i + 1} (run-to-run): {describe(both.iloc[:, 1] / both.iloc[:, 0])}")
        both = pd.concat([with_[i], with_[i + 1]], axis=1).dropna()
        print(f"with, run {i + 2} / run {i + 1} (run-to-run): {describe(both.iloc[:, 1] / both.iloc[:, 0])}")


if __name__ == "__main__":
    main()
