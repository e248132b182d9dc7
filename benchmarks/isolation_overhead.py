"""What does running every backend in a supervised worker process cost? Default CPU run, isolated vs not.

    python benchmarks/isolation_overhead.py [--pairs 3] [--matrix default]

After one untimed warm-up run, alternates `pytest suites --matrix M` with and without --no-isolate (ABBA order,
so a slow spell of a shared machine hits both), wall time of each, and prints the overhead of isolation per pair
and the median.
Target (issue: crashes and hangs): <= 10 % of wall time on the default CPU run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time


def run(matrix: str, isolate: bool) -> float:
    with tempfile.TemporaryDirectory() as results:
        cmd = [sys.executable, "-m", "pytest", "suites", "--matrix", matrix, "--results-dir", results, "-q",
               "-p", "no:cacheprovider", "--no-report", *([] if isolate else ["--no-isolate"])]
        start = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode not in (0, 1):
            raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-2000:])
        return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--matrix", default="default")
    args = parser.parse_args()
    # One untimed run first: the first run on a machine fills torch.compile's on-disk cache (flex compiles for
    # minutes cold), which would otherwise land on whichever side runs first (seen: 440 s against ~100 s).
    warm = run(args.matrix, True)
    print(f"warm-up run (not counted): {warm:.1f} s", flush=True)
    overheads = []
    for i in range(args.pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        times = {isolate: run(args.matrix, isolate) for isolate in order}
        overhead = times[True] / times[False] - 1
        overheads.append(overhead)
        print(f"pair {i + 1}: isolated {times[True]:.1f} s, in-process {times[False]:.1f} s: overhead {overhead:+.1%}",
              flush=True)
    print(f"isolation overhead on the {args.matrix} matrix: median {statistics.median(overheads):+.1%} over "
          f"{len(overheads)} pairs (target <= 10 %)")


if __name__ == "__main__":
    main()
