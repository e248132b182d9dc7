"""How long does drawing a stored run's figures take, one kind after another and in parallel processes?

    python benchmarks/figure_drawing.py RUN_DIR [--jobs 1,2] [--repeats 2]

Each kind's figures (harness.report.plots.FIGURE_BUILDERS) built and written one after another, then the whole of
`plot_run` with each --jobs value (a fresh pool per value: its processes' imports are counted, as a run's report
pays them). Figures go to a temporary folder; the run's own are not touched. The figures behind plot_run's default
(one drawing process per usable core).
"""

from __future__ import annotations

import argparse
import tempfile
import time

from harness.report.data import load_run
from harness.report.plots import FIGURE_BUILDERS, _draw, close_drawing_pools, plot_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--jobs", default="1,2", help="comma-separated process counts")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    run = load_run(args.run_dir)
    with tempfile.TemporaryDirectory() as out:
        serial = {}
        for kind, build in FIGURE_BUILDERS.items():
            start = time.perf_counter()
            _draw(build, run, out)
            serial[kind] = time.perf_counter() - start
        print("one kind after another: " + ", ".join(f"{k} {s:.1f} s" for k, s in serial.items())
              + f"; total {sum(serial.values()):.1f} s")
        for jobs in (int(j) for j in args.jobs.split(",")):
            walls = []
            for _ in range(args.repeats):
                close_drawing_pools()  # a fresh pool: its start-up is part of what a run pays
                start = time.perf_counter()
                plot_run(run, out, jobs=jobs)
                walls.append(time.perf_counter() - start)
            print(f"plot_run jobs={jobs}: " + ", ".join(f"{w:.1f} s" for w in walls))


if __name__ == "__main__":
    main()
