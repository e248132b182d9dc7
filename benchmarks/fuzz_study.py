"""`check --fuzz` across seeds: does it find each planted geometry bug, how small is the shrunk case, does each
printed command reproduce it (and pass on the honest twin); do the honest built-ins pass with no false failure.

    .venv/bin/python benchmarks/fuzz_study.py planted --seeds 1-5
    .venv/bin/python benchmarks/fuzz_study.py honest --seeds 1-20 [--budget-s 60]
    .venv/bin/python benchmarks/fuzz_study.py fit --seeds 1-3 --backends naive   # call_s (flex: compile_s)

Prints one line per seed and a JSON summary (docs/measurements.md, "fuzzing", has the figures).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLANTED = ROOT / "tests" / "fixtures" / "planted_geometry.py"
HONEST = "naive,sdpa,sdpa-math,flex"


def check(*args: str, results: Path) -> tuple[int, str, float]:
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "harness", "check", *args, "--results-dir", str(results)],
                         cwd=ROOT, capture_output=True, text=True)
    return res.returncode, res.stdout + res.stderr, time.monotonic() - start


def bug_of(case_id: str) -> str:
    """Which planted bug a shrunk case triggers (tests/fixtures/planted_geometry.py), by its geometry."""
    from harness.cases.case import AttentionCase
    c = AttentionCase.from_id(case_id)
    found = [name for name, hit in (("gqa-group-3", c.heads // c.kv_heads == 3 and c.kv_heads >= 2),
                                    ("head-dim-80", c.head_dim == 80), ("batch-1", c.batch == 1 and c.seq_k >= 2))
             if hit]
    return "+".join(found) or "none"


def beyond_trigger(case_id: str) -> dict:
    """How far each dimension of a shrunk case is past the least value its bug needs."""
    from harness.cases.case import AttentionCase
    c = AttentionCase.from_id(case_id)
    # a dropped key and a head dim cut to 64 change nothing when there is one key to attend to: both need two
    least = {"batch": 1, "seq_q": 1, "seq_k": 2 if {"batch-1", "head-dim-80"} & set(bug_of(case_id).split("+")) else 1,
             "head_dim": 80 if c.head_dim == 80 else 1, "kv_heads": 2 if c.heads // c.kv_heads == 3 else 1}
    return {d: getattr(c, d) - n for d, n in least.items()}


def latest_env(results: Path) -> dict:
    return json.loads(max(results.glob("*/env.json"), key=os.path.getmtime).read_text())


def planted(seed: int, budget: float, work: Path) -> dict:
    code, out, seconds = check("--backend-module", str(PLANTED), "--backends", "planted-geometry", "--fuzz",
                               "--seed", str(seed), "--fuzz-budget-s", str(budget), results=work / f"p{seed}")
    fuzz = latest_env(work / f"p{seed}")["fuzz"]
    failures = []
    for f in fuzz["failures"]:
        argv = shlex.split(f["repro"])[4:]                      # after `python -m harness check`
        again, _, _ = check(*argv, results=work / f"r{seed}")
        honest = argv.copy()
        honest[honest.index("--backends") + 1] = "planted-honest"
        passes, _, _ = check(*honest, results=work / f"h{seed}")
        failures.append({"bug": bug_of(f["case"]), "case": f["case"], "check": f["check"], "drawn": f["drawn_cases"],
                         "beyond": beyond_trigger(f["case"]), "steps": len(f["steps"]), "stopped": f["stopped"],
                         "repro_exit": again, "honest_exit": passes})
    return {"seed": seed, "exit": code, "seconds": round(seconds), "drawn": fuzz["drawn"], "run": fuzz["run"],
            "check_s": fuzz["check_s"], "estimated_s": fuzz["estimated_s"], "shrink_s": fuzz["shrink_s"],
            "unshrunk": fuzz["unshrunk"], "load": os.getloadavg()[0], "bugs": sorted({f["bug"] for f in failures}), "failures": failures}


def honest(seed: int, budget: float, work: Path, backends: str = HONEST) -> dict:
    code, out, seconds = check("--backends", backends, "--fuzz", "--seed", str(seed), "--fuzz-budget-s", str(budget),
                               results=work / f"n{seed}")
    fuzz = latest_env(work / f"n{seed}")["fuzz"]
    return {"seed": seed, "exit": code, "seconds": round(seconds), "drawn": fuzz["drawn"], "run": fuzz["run"],
            "check_s": fuzz["check_s"], "estimated_s": fuzz["estimated_s"], "reference_s": fuzz["reference_s"],
            "calls": fuzz["calls"], "compiles": fuzz["compiles"], "load": os.getloadavg()[0],
            "failures": [(f["backend"], f["case"], f["check"]) for f in fuzz["failures"]]}


def fit(seed: int, budget: float, work: Path, backends: str = "naive") -> dict:
    """One fuzz run's seconds beyond the cost model's reference and baseline, per backend call (and, for a backend
    that compiles per shape, per compile at the call cost in use): planning/cost.py's fitted CPU call_s (with its
    case_s) and compile_s, which fuzz's plan reads (rates.FITTED)."""
    from harness.planning.rates import FITTED
    code, out, seconds = check("--backends", backends, "--fuzz", "--seed", str(seed), "--fuzz-budget-s", str(budget),
                               results=work / f"f{seed}")
    fuzz = latest_env(work / f"f{seed}")["fuzz"]
    beyond = fuzz["check_s"] - fuzz["reference_s"]
    row = {"seed": seed, "exit": code, "seconds": round(seconds), "drawn": fuzz["drawn"], "run": fuzz["run"],
           "check_s": fuzz["check_s"], "reference_s": fuzz["reference_s"], "calls": fuzz["calls"],
           "compiles": fuzz["compiles"], "call_s": round(beyond / fuzz["calls"], 3)}
    if fuzz["compiles"]:
        row["compile_s"] = round((beyond - fuzz["calls"] * FITTED["cpu"].call_s) / fuzz["compiles"], 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", choices=("planted", "honest", "fit"))
    parser.add_argument("--seeds", default="1-5", help="first-last")
    parser.add_argument("--budget-s", type=float, default=60.0)
    parser.add_argument("--backends", default=None, help=f"the honest study's backends ({HONEST}) or the fit's (naive)")
    args = parser.parse_args()
    first, last = map(int, args.seeds.split("-"))
    studies = {"planted": planted, "honest": functools.partial(honest, backends=args.backends or HONEST),
               "fit": functools.partial(fit, backends=args.backends or "naive")}
    study = studies[args.study]
    results = []
    with tempfile.TemporaryDirectory() as work:
        for seed in range(first, last + 1):
            row = study(seed, args.budget_s, Path(work))
            print(json.dumps(row), flush=True)
            results.append(row)
    print(json.dumps({"study": args.study, "backends": args.backends, "budget_s": args.budget_s,
                      "load": os.getloadavg(), "seeds": len(results), "seconds": [r["seconds"] for r in results]}))


if __name__ == "__main__":
    main()
