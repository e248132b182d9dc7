"""How well does the regression gate decide on this machine? Real runs, real timing: A/B and A/A pairs.

    python benchmarks/gate_study.py [--pairs 20] [--out DIR]
        [--parts process,smoke-ab,smoke-aa,default-ab,default-aa,noise,load,quiet] [--select EXPR] [--busy 2]

Run it from a clean checkout (a clone): the A/B parts make git worktrees of its HEAD. Each pair is the CI recipe
in the README: two `pytest suites --benchmark` runs, then `python -m harness compare BASE NEW --remeasure`.

- A/B pairs are two commits' code: a worktree `base` of HEAD, and a worktree `new` of HEAD whose
  tests/fixtures/slow_backends.py makes sdpa-math-tunable do the whole attention twice (HARNESS_REPEAT's default
  2) or spin for a quarter of its time more (HARNESS_SLOWDOWN's default 0.25: 1.25x exactly). Each side runs in
  its worktree; compare runs in `new` with `--base-checkout base`, so re-measurement times both commits in pairs.
- A/A pairs are one commit's code (this checkout): compare pairs the base side here by itself.

- process: two persistent workers of one code, one key at a time, interleaved in pairs for 12 rounds: is there a
  per-process offset that persistent workers would carry into every pair? (what RemeasureConfig.fresh_workers
  would remove)
- smoke-ab: N pairs, --matrix smoke, the tunable backend at 1x then 2x. Targets: exit 1 in >= 19 of 20; each
  slowed key ends "slower" (not undecided) in >= 95 % of them; the whole gate (two runs + re-measurement) in
  <= 3 minutes.
- smoke-aa: N+1 runs of unchanged code, all CPU backends, each compared with the one before (N pairs).
  Target: exit 0 in >= 19 of 20.
- default-ab: one pair, the default matrix, the tunable backend at 1x then 1.25x. Target: >= 80 % of keys
  flagged slower.
- default-aa: one pair of the default matrix, all CPU backends. Target: <= 1 % of keys flagged.
- load, quiet: N rounds of the README's CI recipe on the smoke keys `--select` picks, each an A/A pair (two runs of
  this commit, compare --remeasure) and an A/B pair (the 2x worktree); `load` with `--busy` bursty CPU-bound
  processes started and killed by the study around each pair. Targets: A/A never exit 1 under load (0 or 3),
  exit 0 when quiet; the 2x exit 1 when quiet; under load, whatever it gets (reported).
- redecide: the stored load/quiet pairs decided again with this checkout's rule (part_redecide).
- noise: the stored smoke pairs decided again, without re-measurement, with a noise model learned from the A/A
  runs (`history --noise`; leave-one-out for the A/A pairs): what a testbed gets once it has a noise model.

Prints one line per pair and a summary with the targets; writes study.csv under --out. No noise model is
built (every margin is --min-effect): the figures are what a first-day user gets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
ALL_CPU = ["--backends", "all"]


def run_suite(results: Path, matrix: str, backends: list[str], cwd: Path = ROOT, select: str | None = None
              ) -> tuple[Path, float]:
    """One `pytest suites --benchmark` run in checkout `cwd` (`select`: a -k expression); its run dir and wall
    seconds."""
    before = set(results.glob("*")) if results.exists() else set()
    start = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "suites", "--matrix", matrix, "--benchmark", "--results-dir", str(results),
           "-q", "-p", "no:cacheprovider", "--no-report", "--benchmark-quiet", *backends,
           *(["-k", select] if select else [])]
    proc = subprocess.run(cmd, cwd=cwd, env=_env(cwd), capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"suite run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    (new,) = set(results.glob("*")) - before - {results / "noise", results / "history"}
    return new, time.monotonic() - start


def _env(cwd: Path) -> dict:
    """The environment of a step run in checkout `cwd`: its code first on the path, no tunable-backend knobs (the
    checkout's code is what differs)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HARNESS_REPEAT", "HARNESS_SLOWDOWN")}
    return {**env, "PYTHONPATH": str(cwd)}


def gate(base: Path, new: Path, budget_s: float, cwd: Path = ROOT, base_checkout: Path | None = None,
         printed: list | None = None) -> tuple[int, pd.DataFrame, float]:
    """compare --remeasure in checkout `cwd`: (exit code, compare.csv, wall seconds); `printed` gets its output."""
    start = time.monotonic()
    out = new / f"study-vs-{base.name}"
    extra = ["--base-checkout", str(base_checkout)] if base_checkout else []
    proc = subprocess.run([sys.executable, "-m", "harness", "compare", str(base), str(new), "--remeasure",
                           "--remeasure-budget-s", str(budget_s), "--out", str(out), *extra], cwd=cwd,
                          env=_env(cwd), capture_output=True, text=True)
    if proc.returncode == 2:
        raise RuntimeError(f"compare failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    if printed is not None:
        printed.append(proc.stdout)
    return proc.returncode, pd.read_csv(out / "compare.csv"), time.monotonic() - start


#: what the `new` worktree changes in tests/fixtures/slow_backends.py: the tunable backend's default knobs
SLOWER_CODE = {"2x": ('HARNESS_REPEAT", "1")', 'HARNESS_REPEAT", "2")'),
               "1.25x": ('HARNESS_SLOWDOWN", "0")', 'HARNESS_SLOWDOWN", "0.25")')}


def worktrees(out: Path, change: str) -> tuple[Path, Path]:
    """Two git worktrees of HEAD under `out`: `base` as committed, `new` with the slowdown `change` applied."""
    if subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                      text=True).stdout.strip():
        raise SystemExit("gate_study: the A/B parts make worktrees of HEAD; commit (or run from a clean clone) first")
    paths = []
    for name in ("base", "new"):
        path = out / f"worktree-{change}-{name}"
        if path.exists():
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, capture_output=True)
            shutil.rmtree(path, ignore_errors=True)
        subprocess.run(["git", "worktree", "add", "--detach", str(path), "HEAD"], cwd=ROOT, check=True,
                       capture_output=True)
        paths.append(path)
    fixture = paths[1] / "tests" / "fixtures" / "slow_backends.py"
    old, new = SLOWER_CODE[change]
    text = fixture.read_text()
    if old not in text:
        raise SystemExit(f"gate_study: {fixture} no longer contains {old!r}; update SLOWER_CODE")
    fixture.write_text(text.replace(old, new))
    return paths[0], paths[1]


def timed(df: pd.DataFrame) -> pd.DataFrame:
    return df[df.verdict.isin(["slower", "faster", "unchanged", "undecided"])]


def part_ab(out: Path, pairs: int, matrix: str, change: str, budget_s: float, log) -> list[dict]:
    base_tree, new_tree = worktrees(out, change)
    backends = ["--backend-module", "tests/fixtures/slow_backends.py", "--backends", "sdpa-math-tunable"]
    rows = []
    for i in range(pairs):
        results = out / f"{matrix}-ab-{i:02d}"
        a, a_s = run_suite(results, matrix, backends, base_tree)
        b, b_s = run_suite(results, matrix, backends, new_tree)
        code, df, g_s = gate(a, b, budget_s, new_tree, base_tree)
        t = timed(df)
        row = {"part": f"{matrix}-ab", "pair": i, "exit": code, "keys": len(t), "slower": int((t.verdict == "slower").sum()),
               "undecided": int((t.verdict == "undecided").sum()), "flagged_first": int(t.first_verdict.isin(
                   ["slower", "undecided"]).sum() + (t.verdict.isin(["slower", "undecided"]) & ~t.remeasured).sum()),
               "remeasured": int(t.remeasured.sum()), "paired": int(t.note.str.contains("paired rounds").sum()),
               "gate_s": a_s + b_s + g_s, "compare_s": g_s}
        rows.append(row)
        log(row)
    return rows


def part_aa(out: Path, pairs: int, matrix: str, budget_s: float, log) -> list[dict]:
    results = out / f"{matrix}-aa"
    prev, _ = run_suite(results, matrix, ALL_CPU)
    rows = []
    for i in range(pairs):
        new, n_s = run_suite(results, matrix, ALL_CPU)
        code, df, g_s = gate(prev, new, budget_s)
        t = timed(df)
        row = {"part": f"{matrix}-aa", "pair": i, "exit": code, "keys": len(t),
               "slower": int((t.verdict == "slower").sum()), "undecided": int((t.verdict == "undecided").sum()),
               "flagged_first": int(t.first_verdict.isin(["slower", "undecided"]).sum()),
               "remeasured": int(t.remeasured.sum()), "paired": int(t.note.str.contains("paired rounds").sum()),
               "gate_s": n_s + g_s, "compare_s": g_s}
        rows.append(row)
        log(row)
        prev = new
    return rows


#: a CPU-bound busy process that comes and goes (spins 0.05-2 s, sleeps 0.05-1 s), ending by itself after argv[1]
#: seconds: bursty load like other CI jobs, never left behind by a crashed study
BUSY = """import random, sys, time
end, rng = time.monotonic() + float(sys.argv[1]), random.Random(int(sys.argv[2]))
while time.monotonic() < end:
    spin = time.monotonic() + rng.uniform(0.05, 2.0)
    while time.monotonic() < spin:
        pass
    time.sleep(rng.uniform(0.05, 1.0))
"""


class Busy:
    """`n` BUSY processes for at most `limit_s` seconds, started on entry and killed (by their pids) on exit."""

    def __init__(self, n: int, limit_s: float, seed: int = 0):
        self.n, self.limit_s, self.seed, self.procs = n, limit_s, seed, []

    def __enter__(self):
        self.procs = [subprocess.Popen([sys.executable, "-c", BUSY, str(self.limit_s), str(self.seed + i)])
                      for i in range(self.n)]
        return self

    def __exit__(self, *exc):
        for proc in self.procs:
            proc.kill()
            proc.wait()
        self.procs = []


def part_load(out: Path, pairs: int, loaded: bool, select: str, budget_s: float, busy: int, log,
              kinds: tuple[str, ...] = ("aa", "ab")) -> list[dict]:
    """The README's CI recipe under load (`busy` bursty CPU-bound processes started and stopped by the study) or
    without it: per pair, two runs of one commit then compare --remeasure (A/A), and the 2x slowdown of the
    tunable backend in a second worktree (A/B), each on the smoke matrix's keys that `select` picks."""
    base_tree, new_tree = worktrees(out, "2x")
    backends = ["--backend-module", "tests/fixtures/slow_backends.py", "--backends", "sdpa-math-tunable"]
    name = "load" if loaded else "quiet"
    rows = []
    for i in range(pairs):
        for kind, (a_tree, b_tree) in (("aa", (ROOT, ROOT)), ("ab", (base_tree, new_tree))):
            if kind not in kinds:
                continue
            results = out / f"{name}-{kind}-{i:02d}"
            printed: list[str] = []
            with Busy(busy if loaded else 0, limit_s=1800, seed=i):
                load_start = os.getloadavg()[0]
                a, a_s = run_suite(results, "smoke", backends, a_tree, select)
                b, b_s = run_suite(results, "smoke", backends, b_tree, select)
                code, df, g_s = gate(a, b, budget_s, b_tree, None if kind == "aa" else a_tree, printed)
                load_end = os.getloadavg()[0]
            t = timed(df)
            why = t[t.verdict == "undecided"].note.astype(str)
            row = {"part": f"{name}-{kind}", "pair": i, "exit": code, "keys": len(t),
                   "slower": int((t.verdict == "slower").sum()), "undecided": int((t.verdict == "undecided").sum()),
                   "flagged_first": int(t.first_verdict.isin(["slower", "undecided"]).sum()),
                   "remeasured": int(t.remeasured.sum()), "gate_s": a_s + b_s + g_s, "compare_s": g_s,
                   "load_start": load_start, "load_end": load_end,
                   "noisy": int(why.str.contains("machine's noise").sum()),
                   "max_ratio": float(t.ratio.max()) if len(t) else float("nan")}
            rows.append(row)
            log(row)
    return rows


def part_redecide(out: Path, log) -> list[dict]:
    """The stored pairs of the load and quiet parts decided again with this checkout's paired_verdict (what a
    change of the decision rule does to the same measurements): each re-measured key on its stored base and new
    rounds (NEW_RUN/remeasure/), at the family level of its pair, with the load average the study read at the
    end of that pair's compare; the other keys keep their verdict. Prints the exit code each pair would get."""
    import numpy as np

    from harness.compare.remeasure import RemeasureConfig
    from harness.measure.paired import paired_verdict
    from harness.measure.stats import FAMILY_ALPHA, SLOWER, UNDECIDED

    logged = out / "rows.jsonl"
    study = pd.read_json(logged, lines=True) if logged.exists() else None
    rows = []
    for pair_dir in sorted(out.glob("*-a[ab]-*")):
        found = list(pair_dir.glob("*/study-vs-*/compare.csv"))
        if len(found) != 1 or "+" in pair_dir.name:  # a pair still running, or not one of these parts
            continue
        csv = found[0]
        new_dir = csv.parent.parent
        df = timed(pd.read_csv(csv))
        part, i = pair_dir.name.rsplit("-", 1)
        load = None
        if study is not None:
            hit = study[(study.part == part) & (study.pair == int(i))]
            load = (float(hit.load_end.iloc[0]), os.cpu_count() or 1) if len(hit) else None
        fresh = {side: pd.read_csv(new_dir / "remeasure" / name) for side, name in
                 (("new", "samples.csv"), ("base", "base-samples.csv")) if (new_dir / "remeasure" / name).exists()}
        verdicts = list(df.verdict)
        re = df.remeasured.astype(bool).to_numpy()
        for j, r in enumerate(df.itertuples()):
            if not re[j] or "base" not in fresh:
                continue
            medians = [g[(g.case_id == r.case_id) & (g.phase == r.phase)].groupby("round").latency_ms.median()
                       for g in (fresh["base"], fresh["new"])]
            both = medians[0].index.intersection(medians[1].index)
            verdicts[j] = UNDECIDED if len(both) < RemeasureConfig.min_rounds else paired_verdict(
                np.asarray(medians[0][both]), np.asarray(medians[1][both]), alpha=FAMILY_ALPHA / re.sum(),
                load=load).verdict  # fewer pairs than that: the budget ended, never a pass (remeasure's rule)
        code = 1 if SLOWER in verdicts else 3 if UNDECIDED in verdicts else 0
        rows.append({"part": f"{part}+redecided", "pair": int(i), "exit": code, "keys": len(df),
                     "slower": verdicts.count(SLOWER), "undecided": verdicts.count(UNDECIDED)})
        log(rows[-1])
    return rows


def part_process(rounds: int, log) -> list[dict]:
    """Two persistent workers of this code time the same keys in pairs (ABBA), `rounds` rounds: the mean log
    difference of each key in units of its standard error. Without a per-process offset these are ~N(0, 1)."""
    import numpy as np
    import torch

    from harness.backends.registry import get_backends
    from harness.calls.call import Call
    from harness.isolation.executor import make_executor
    from harness.calls.timed import TimingCall
    from harness.measure.timing import TimingConfig
    from harness.cases.matrices import build_matrix

    cases = {c.id: c for c in build_matrix("smoke")}
    config = TimingConfig(8.3, 33.3, 4, 167)  # a smoke run's per-round share (3 rounds)
    keys = [("sdpa-math", "fp32-b2-h4-s17x33-d32-none", "fwd"), ("naive", "bf16-b2-h4-s161-d32-none", "fwd+bwd"),
            ("sdpa", "fp32-b2-h4-s17x33-d32-causal", "bwd"), ("flex", "bf16-b2-h4-s161-d32-causal", "fwd"),
            ("sdpa-flash", "fp32-b2-h4-s161-d32-none", "fwd+bwd"), ("naive", "fp32-b2-h4-s17x33-d32-causal", "fwd")]
    device = torch.device("cpu")
    first, second = make_executor(device, isolate=True), make_executor(device, isolate=True)
    medians: dict = {k: ([], []) for k in keys}
    try:
        for r in range(rounds + 1):  # round 0 warms both workers (first calls, compiles) and is dropped
            for position, k in enumerate(keys):
                (backend,) = get_backends([k[0]])
                pair = (first, second) if (r + position) % 2 == 0 else (second, first)
                for executor in pair:
                    got = executor.time(backend, TimingCall(Call(cases[k[1]], 0), k[2], config, estimate_ms=0.3,
                                                            known_memory=(0, "not measured")), device)
                    if r:
                        medians[k][executor is second].append(float(np.median(got.measurement.samples_ms)))
    finally:
        first.close()
        second.close()
    rows = []
    for k, (a, b) in medians.items():
        d = np.log(b) - np.log(a)
        se = d.std(ddof=1) / np.sqrt(len(d))
        rows.append({"part": "process", "pair": "|".join(k), "mean_log_diff": float(d.mean()), "se": float(se),
                     "z": float(d.mean() / se), "keys": 1})
        log(rows[-1])
    return rows


def noise_model_from(runs: list[Path], where: Path) -> Path:
    """`history --noise` over `runs` (linked into `where`): the testbed's noise model file."""
    where.mkdir(parents=True, exist_ok=True)
    for run in runs:
        (where / run.name).symlink_to(run.resolve(), target_is_directory=True)
    subprocess.run([sys.executable, "-m", "harness", "history", str(where), "--noise"], cwd=ROOT, check=True,
                   capture_output=True, text=True)
    (model,) = (where / "noise").glob("*.json")
    return model


def decide(base: Path, new: Path, model: Path, out: Path) -> tuple[int, pd.DataFrame]:
    """compare with a noise model and no re-measurement: (exit code, compare.csv)."""
    proc = subprocess.run([sys.executable, "-m", "harness", "compare", str(base), str(new), "--noise", str(model),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode == 2:
        raise RuntimeError(f"compare failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc.returncode, pd.read_csv(out / "compare.csv")


def _decided(part: str, pair: int, code: int, t: pd.DataFrame) -> dict:
    return {"part": part, "pair": pair, "exit": code, "keys": len(t), "slower": int((t.verdict == "slower").sum()),
            "undecided": int((t.verdict == "undecided").sum()),
            "flagged_first": int(t.verdict.isin(["slower", "undecided"]).sum()), "remeasured": 0,
            "margin_median": float(t.margin.median())}


def part_noise(out: Path, log) -> list[dict]:
    """The stored smoke pairs decided again with a noise model learned from the A/A runs (what a testbed has
    after `history --noise`): each A/A pair with a model from the other A/A runs (leave its own two out), each
    A/B pair with a model from all of them. No re-measurement: the decision on the runs' own rounds."""
    from harness.store.run_dir import is_run_dir

    aa = sorted(p for p in (out / "smoke-aa").iterdir() if is_run_dir(p))
    work = out / "noise-analysis"
    rows = []
    for i, (base, new) in enumerate(zip(aa, aa[1:])):
        model = noise_model_from([r for r in aa if r not in (base, new)], work / f"aa-{i:02d}")
        code, df = decide(base, new, model, work / f"aa-{i:02d}" / "compare")
        rows.append(_decided("smoke-aa+noise", i, code, timed(df)))
        log(rows[-1])
    model = noise_model_from(aa, work / "all")
    for i, pair_dir in enumerate(sorted((out).glob("smoke-ab-*"))):
        a, b = sorted(p for p in pair_dir.iterdir() if is_run_dir(p))
        code, df = decide(a, b, model, work / f"ab-{i:02d}")
        rows.append(_decided("smoke-ab+noise", i, code, timed(df)))
        log(rows[-1])
    return rows


def summary(df: pd.DataFrame) -> list[str]:
    lines = []
    for part, g in df.groupby("part", sort=False):
        n = len(g)
        if part == "process":
            from scipy.stats import chi2

            z2 = float((g.z ** 2).sum())
            p = float(chi2.sf(z2, n))
            lines.append(f"process offsets: {n} keys, |mean log difference| between two persistent workers at most "
                         f"{g.mean_log_diff.abs().max():.3f}; sum of z^2 {z2:.1f} on {n} degrees of freedom "
                         f"(p = {p:.2f}: {'no offset detected' if p > 0.05 else 'an offset'})")
        elif part == "smoke-ab":
            caught = (g.exit == 1).sum()
            share = (g.slower / g["keys"]).mean()
            lines.append(f"smoke A/B (2x): exit 1 in {caught}/{n} pairs (target >= 19/20); slowed keys ending "
                         f"'slower' after re-measurement: {share:.1%} on average, worst pair "
                         f"{(g.slower / g['keys']).min():.1%} (target >= 95 %); whole gate {g.gate_s.median():.0f} s "
                         f"median, {g.gate_s.max():.0f} s max (target <= 180 s)")
        elif part == "smoke-aa":
            lines.append(f"smoke A/A: exit 0 in {(g.exit == 0).sum()}/{n} pairs (target >= 19/20); keys flagged "
                         f"at first {g.flagged_first.sum()}/{g['keys'].sum()}, still flagged after re-measurement "
                         f"{(g.slower + g.undecided).sum()}/{g['keys'].sum()}; gate {g.gate_s.median():.0f} s median")
        elif part == "smoke-aa+noise":
            lines.append(f"smoke A/A with a leave-one-out noise model, no re-measurement: exit 0 in {(g.exit == 0).sum()}/{n} "
                         f"pairs (target >= 19/20); keys flagged {(g.slower + g.undecided).sum()}/{g['keys'].sum()}; "
                         f"median margin {g.margin_median.median():.2f}x")
        elif part == "smoke-ab+noise":
            lines.append(f"smoke A/B (2x) with the A/A noise model, no re-measurement: exit 1 in {(g.exit == 1).sum()}/{n} "
                         f"pairs; slowed keys ending 'slower' {(g.slower / g['keys']).mean():.1%} on average, worst pair "
                         f"{(g.slower / g['keys']).min():.1%}; median margin {g.margin_median.median():.2f}x")
        elif part.endswith("+redecided"):
            exits = ", ".join(f"{c}: {k}" for c, k in sorted(g.exit.value_counts().items()))
            lines.append(f"{part} (stored pairs, this checkout's rule): exit codes {{{exits}}} in {n} pairs; keys "
                         f"slower {g.slower.sum()}, undecided {g.undecided.sum()} of {g['keys'].sum()}")
        elif part.startswith(("load-", "quiet-")):
            loads = f"load average {g.load_start.min():.1f}-{g.load_end.max():.1f}"
            exits = ", ".join(f"{c}: {k}" for c, k in sorted(g.exit.value_counts().items()))
            lines.append(f"{part}: exit codes {{{exits}}} in {n} pairs; keys slower {g.slower.sum()}, undecided "
                         f"{g.undecided.sum()} (machine's noise {g.noisy.sum()}) of {g['keys'].sum()}; {loads}; "
                         f"pair {g.gate_s.median():.0f} s median")
        elif part == "default-ab":
            lines.append(f"default A/B (1.25x): {(g.slower.sum() / g['keys'].sum()):.1%} of keys flagged slower "
                         f"(target >= 80 %), {g.undecided.sum()} undecided")
        elif part == "default-aa":
            flagged = (g.slower + g.undecided).sum()
            lines.append(f"default A/A: {flagged}/{g['keys'].sum()} keys flagged ({flagged / g['keys'].sum():.2%}; "
                         f"target <= 1 %); exit {list(g.exit)}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--parts", default="process,smoke-ab,smoke-aa,default-ab,default-aa")
    parser.add_argument("--budget-s", type=float, default=120.0, help="--remeasure-budget-s of each smoke compare")
    parser.add_argument("--out", type=Path, default=Path("/tmp/gate-study"))
    parser.add_argument("--select", default="fp32-b2-h4-s64",
                        help="-k expression: the smoke keys of the load and quiet parts (default: 6 keys)")
    parser.add_argument("--busy", type=int, default=2, help="busy processes of the load parts")
    parser.add_argument("--kinds", default="aa,ab", help="the load and quiet parts' pairs: aa (unchanged code), ab (2x)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    def log(row: dict) -> None:
        print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        with (args.out / "rows.jsonl").open("a") as f:  # every row as it comes: a study stopped early keeps them
            f.write(json.dumps(row, default=str) + "\n")
    rows = []
    parts = args.parts.split(",")
    if "process" in parts:
        rows += part_process(12, log)
    if "smoke-ab" in parts:
        rows += part_ab(args.out, args.pairs, "smoke", "2x", args.budget_s, log)
    if "smoke-aa" in parts:
        rows += part_aa(args.out, args.pairs, "smoke", args.budget_s, log)
    if "default-ab" in parts:
        rows += part_ab(args.out, 1, "default", "1.25x", 600.0, log)
    if "default-aa" in parts:
        rows += part_aa(args.out, 1, "default", 600.0, log)
    for loaded, part in ((True, "load"), (False, "quiet")):
        if part in parts:
            rows += part_load(args.out, args.pairs, loaded, args.select, args.budget_s, args.busy, log,
                              tuple(args.kinds.split(",")))
    if "redecide" in parts:  # needs the stored load/quiet pairs (and their study.csv) under --out
        rows += part_redecide(args.out, log)
    if "noise" in parts:  # needs the stored smoke-aa and smoke-ab runs under --out
        rows += part_noise(args.out, log)
    df = pd.DataFrame(rows)
    df.to_csv(args.out / "study.csv", index=False)
    print("\n".join(summary(df)))


if __name__ == "__main__":
    main()
