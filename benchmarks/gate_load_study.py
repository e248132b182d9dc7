"""Does the gate have power on a busy runner? Issue 65's study: real runs of a user's own kernel beside a second job.

    python benchmarks/gate_load_study.py [--ab 10] [--aa 20] [--busy 6] [--matrix smoke] [--backends my-attn,naive]
        [--out DIR] [--fresh-runs]

Run it from a clean checkout (a clone): `compare --remeasure` times the checkout's code. What it does, as
docs/regressions.md's recipe for "your own kernel, harness unchanged":

1. writes a kernel outside the repository (`my_attn.py`: the README's plugin, its attention computed REPEAT times,
   forward and backward);
2. starts the second job: `--busy` CPU-bound processes (default 3 per CPU), for the whole study;
3. a base run of the kernel and naive (`pytest suites --backend-module ... --benchmark`), then the kernel edited to
   do its work twice (same answers) and a run of it (A/B), and the kernel restored and a run of it (A/A);
4. each trial is `python -m harness compare BASE NEW --remeasure` with its default budget on a copy of the new run
   (the runs' own rounds, taken under load, decide nothing: the re-measurement does, from fresh pairs each trial);
   `--fresh-runs` makes new base and new runs for every trial instead (slower).

Targets (issue 65): at load >= 3 per CPU, the 2x kernel exits 1 in at least 9 of 10 trials; unchanged code exits 1 in
none of 20 (0 or 3). Prints one line per trial and a summary; writes study.csv under --out.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]

KERNEL = '''"""The study's kernel: the README's plugin, its attention done REPEAT times, forward and backward
(the mean of REPEAT equal answers: bit for bit the answer for REPEAT 1 or 2)."""
import torch.nn.functional as F

from harness import Backend, register

REPEAT = {repeat}


@register
class MyAttention(Backend):
    name = "my-attn"
    layout = "bhsd"

    def forward(self, q, k, v, *, mask, scale):
        dense = None if mask is None else mask.materialize(q.shape[2], k.shape[2], q.device, batch=q.shape[0])
        outs = [F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=scale,
                                               enable_gqa=k.shape[1] != q.shape[1]) for _ in range(REPEAT)]
        return outs[0] if REPEAT == 1 else sum(outs[1:], outs[0]) / REPEAT
'''

SPIN = "import time\nwhile True:\n    sum(range(10000))\n"


def write_kernel(path: Path, repeat: int) -> None:
    path.write_text(KERNEL.format(repeat=repeat))


def run_suite(results: Path, kernel: Path, matrix: str, backends: str) -> tuple[Path, float]:
    """One `pytest suites --benchmark` run of the kernel (and naive, by default); its run dir and wall seconds."""
    before = set(results.glob("*")) if results.exists() else set()
    start = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "suites", "-q", "-p", "no:cacheprovider", "--benchmark",
           "--backend-module", str(kernel), "--backends", backends, "--matrix", matrix,
           "--results-dir", str(results)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    (new,) = [p for p in set(results.glob("*")) - before if p.is_dir() and p.name != "index"] or [None]
    if new is None:
        raise RuntimeError(f"no run dir from {' '.join(cmd)}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
    return new, time.monotonic() - start


def compare(base: Path, new: Path) -> dict:
    """`compare BASE NEW --remeasure` (default budget): exit code, wall, what it said about the backends."""
    load_before = os.getloadavg()[0]
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "harness", "compare", str(base), str(new), "--remeasure"],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - start
    out = proc.stdout + proc.stderr
    groups = {m.group(1): m.group(2) for m in re.finditer(r"^  (\S+): (\w+) - ", out, re.M)}
    budget = re.search(r"\(budget (.*?)\); ", out)
    counted = re.search(r"re-measured in (\d+) s, (\d+) round\(s\), (\d+) pair\(s\)(?: \((\d+) not counted)?", out)
    return {"exit": proc.returncode, "wall_s": round(wall, 1), "load_start": round(load_before, 1),
            "load_end": round(os.getloadavg()[0], 1), "budget": budget.group(1) if budget else "",
            "rounds": int(counted.group(2)) if counted else None, "pairs": int(counted.group(3)) if counted else None,
            "not_counted": int(counted.group(4) or 0) if counted else None,
            "my_attn": groups.get("my-attn", ""), "naive": groups.get("naive", ""),
            "summary": next((line for line in out.splitlines() if " rows; timing:" in line), "")[-300:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ab", type=int, default=10, help="trials of the 2x kernel")
    parser.add_argument("--aa", type=int, default=20, help="trials of unchanged code")
    parser.add_argument("--busy", type=int, default=3 * (os.cpu_count() or 1), help="CPU-bound processes beside it")
    parser.add_argument("--matrix", default="smoke")
    parser.add_argument("--backends", default="my-attn,naive", help="the kernel's and the controls' (naive)")
    parser.add_argument("--fresh-runs", action="store_true", help="new base and new runs for every trial")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="gate-load-"))
    out.mkdir(parents=True, exist_ok=True)
    results, kernel = out / "results", out / "kernel" / "my_attn.py"
    kernel.parent.mkdir(exist_ok=True)
    print(f"study under {out}; {args.busy} busy processes on {os.cpu_count()} CPUs", flush=True)
    busy = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.busy)]
    rows = []
    try:
        time.sleep(20)  # the load average climbs toward the job's level
        runs: dict[str, tuple[Path, Path]] = {}

        def pair(kind: str) -> tuple[Path, Path]:
            write_kernel(kernel, 1)
            base, base_s = run_suite(results, kernel, args.matrix, args.backends)
            write_kernel(kernel, 2 if kind == "ab" else 1)
            new, new_s = run_suite(results, kernel, args.matrix, args.backends)
            print(f"{kind} runs: base {base.name} ({base_s:.0f} s), new {new.name} ({new_s:.0f} s), "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
            return base, new

        # the kinds interleaved (ab 0, aa 0, ab 1, ...), then the rest of the longer: both see the machine alike
        order = sorted([("ab", t) for t in range(args.ab)] + [("aa", t) for t in range(args.aa)],
                       key=lambda kt: (kt[1], kt[0]))
        for kind, t in order:
            if args.fresh_runs or kind not in runs:
                runs[kind] = pair(kind)
            base, new = runs[kind]
            copy = new.with_name(f"{new.name}-{kind}{t}")
            shutil.copytree(new, copy, ignore=shutil.ignore_patterns("remeasure", "compare-vs-*"))
            row = {"kind": kind, "trial": t, **compare(base, copy)}
            rows.append(row)
            print(f"{kind} {t}: exit {row['exit']} in {row['wall_s']:.0f} s (load {row['load_start']}-"
                  f"{row['load_end']}), budget {row['budget']}, {row['rounds']} round(s), {row['pairs']} pair(s), "
                  f"{row['not_counted']} not counted; my-attn {row['my_attn'] or '-'}, naive {row['naive'] or '-'}",
                  flush=True)
            pd.DataFrame(rows).to_csv(out / "study.csv", index=False)
    finally:
        for p in busy:
            p.kill()
    df = pd.DataFrame(rows)
    for kind, target in (("ab", "exit 1 in >= 9 of 10"), ("aa", "exit 1 in none of 20")):
        part = df[df.kind == kind]
        if part.empty:
            continue
        exits = part.exit.value_counts().to_dict()
        print(f"{kind}: exits {exits} over {len(part)} trials (target: {target}); wall median "
              f"{part.wall_s.median():.0f} s; load {part.load_start.min()}-{part.load_end.max()} on "
              f"{os.cpu_count()} CPUs")
    print(f"wrote {out / 'study.csv'}")


if __name__ == "__main__":
    main()
