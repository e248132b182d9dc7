"""The history index against its targets (issue 50): synthetic nightly runs of 5,000 rows built from a real run's
files, 100 to 1,500 runs on four testbeds; ingest of a new run, `history`, `--noise`, `--changes` (time and peak
memory, each in its own process), beside today's CSV path (load_history) at the sizes it finishes in reasonable time.

    python benchmarks/history_index.py REAL_RUN_DIR --out /tmp/hist --sizes 100 200 400 800 1500 --csv-upto 200

One command for the targets at 1,500 runs (each query's wall s, peak GB and CPU s printed as it runs; ~10 min on two
cores, ~6 GB of disk under --out; REAL_RUN_DIR: any run folder, e.g. one `pytest suites --matrix smoke --rounds 1
--benchmark` made):

    nice -n 19 .venv/bin/python benchmarks/history_index.py results/<run> --out /tmp/hist --sizes 1500 --csv-upto 0

The index of the synthetic runs is made by ingesting one run of each testbed for real and writing every other run's
entry from it with that run's own values (run id, start, sha, latencies): a sample of runs is then ingested for real
and must give the same entry (checked). Everything under --out is deleted at the end unless --keep.
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

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from harness.history.index import INDEX_DIR, fingerprint, read_run
from harness.history.index_store import ParquetStore
from harness.store.load import load_results, load_samples
from harness.store.schema import COLUMNS, KEY

TESTBEDS = 4
ROWS = 5000
ROUNDS, PER_ROUND = 3, 3
#: keys that step 1.3x slower at night 150 of their testbed (a planted regression)
STEP_SHARE, STEP_NIGHT = 0.02, 150


def template(real: Path) -> tuple[pd.DataFrame, dict]:
    """The real run's folded rows repeated (case ids made unique) to ROWS rows, and its env.json."""
    rows = load_results(real).reindex(columns=list(COLUMNS))
    copies = -(-ROWS // len(rows))
    out = pd.concat([rows.assign(case_id=rows.case_id + (f"-v{j}" if j else "")) for j in range(copies)],
                    ignore_index=True).head(ROWS)
    return out, json.loads((real / "env.json").read_text())


def run_values(i: int, timed: np.ndarray, rng) -> dict:
    night, tb = divmod(i, TESTBEDS)
    factor = np.exp(rng.normal(0, 0.03)) * np.exp(rng.normal(0, 0.02, len(timed)))
    stepped = np.arange(len(timed)) < STEP_SHARE * len(timed)
    factor = factor * np.where(stepped & (night >= STEP_NIGHT), 1.3, 1.0)
    return {"name": f"night{night:04d}-tb{tb}", "testbed": f"tb-synthetic-{tb}", "factor": factor,
            "started": (pd.Timestamp("2026-01-01") + pd.Timedelta(days=night)).isoformat(),
            "git_sha": f"{night // 5:07d}" + "a" * 33}


def _write_csv(df: pd.DataFrame, path: Path, as_harness: bool) -> None:
    """pyarrow's writer (fast; it quotes every text cell), or as the harness's csv.writer writes (quotes only where
    needed, CRLF): the run whose ingest is timed is written as the harness writes."""
    if as_harness:
        df.to_csv(path, index=False, lineterminator="\r\n")
    else:
        pacsv.write_csv(pa.Table.from_pandas(df, preserve_index=False), path)


def write_run(root: Path, rows: pd.DataFrame, env: dict, timed: np.ndarray, v: dict,
              as_harness: bool = False) -> Path:
    run = root / v["name"]
    run.mkdir(parents=True, exist_ok=True)
    df = rows.copy()
    df["run_id"], df["testbed_id"], df["git_sha"] = v["name"], v["testbed"], v["git_sha"]
    df.loc[timed, "latency_ms"] = df.loc[timed, "latency_ms"].to_numpy() * v["factor"]
    _write_csv(df, run / "results.csv", as_harness)
    base = df.loc[timed, list(KEY) + ["latency_ms"]]
    spread = np.array([0.98, 1.0, 1.03])  # three samples a round, three rounds: the rounds a little apart
    samples = pd.DataFrame({
        "run_id": v["name"], **{k: np.repeat(base[k].to_numpy(), ROUNDS * PER_ROUND) for k in KEY},
        "round": np.tile(np.repeat(np.arange(ROUNDS), PER_ROUND), len(base)),
        "sample": np.tile(np.arange(ROUNDS * PER_ROUND), len(base)),
        "latency_ms": np.repeat(base.latency_ms.to_numpy(), ROUNDS * PER_ROUND)
        * np.tile(np.outer([1.0, 1.01, 0.99], spread).ravel(), len(base))})
    _write_csv(samples, run / "samples.csv", as_harness)
    (run / "env.json").write_text(json.dumps({**env, "run_id": v["name"], "testbed_id": v["testbed"],
                                              "started": v["started"], "git_sha": v["git_sha"], "status": "done"}))
    return run


def cloned(entry, run: Path, v: dict, timed_keys: pd.DataFrame):
    """The entry an ingest of `run` gives, written from another run's entry of the same shape and testbed."""
    rows, rounds = entry.rows.copy(), entry.rounds.copy()
    rows["run_id"], rows["git_sha"], rows["run_name"] = v["name"], v["git_sha"], v["name"]
    rows["started"], rows["testbed_id"] = v["started"], v["testbed"]
    pos = rows.latency_ms.notna() & (rows.latency_ms > 0)
    f = pd.Series(v["factor"], index=pd.MultiIndex.from_frame(timed_keys))
    keyed = pd.MultiIndex.from_frame(rows.loc[pos, list(KEY)])
    rows.loc[pos, "latency_ms"] = v["base_ms"].reindex(keyed).to_numpy() * f.reindex(keyed).to_numpy()
    rk = pd.MultiIndex.from_frame(rounds[list(KEY)])
    rounds["latency_ms"] = v["base_rounds"].to_numpy() * f.reindex(rk).to_numpy()
    rounds["run_name"] = v["name"]
    m = json.loads(json.dumps(entry.manifest, default=str))
    m.update(name=v["name"], fingerprint=fingerprint(run), run_id=v["name"], testbeds=[v["testbed"]])
    m["summary"].update(run_id=v["name"], started=v["started"], testbed_id=v["testbed"], git_sha=v["git_sha"][:8])
    return type(entry)(m, rows, rounds)


def measure(script: str, *args: str) -> tuple[float, float, float, str]:
    """Seconds of the work itself (the imports before it not counted), the peak memory (GB) of the process that did
    it (imports included: torch alone is ~0.3 GB) and its CPU seconds (user + system: on a shared machine the wall
    time is several times them), each in a process of its own; and a line of its output."""
    p = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{args} exited {p.returncode}: {p.stderr[-2000:]}")
    timed = [line for line in p.stdout.splitlines() if line.startswith("TIMED ")][-1].split()
    said = [line for line in p.stdout.splitlines() if line.strip() and not line.startswith("TIMED ")]
    return float(timed[1]), float(timed[2]), float(timed[3]), said[-1][:200] if said else ""


#: what a user runs: `python -m harness history RESULTS [--noise|--changes]`, timed after its imports
INDEX_SCRIPT = """
import resource, sys, time, warnings; warnings.simplefilter("ignore")
from harness.cli.main import main
import harness.history.index, harness.history.index_store, harness.history.changes, harness.history.noise
import pyarrow.dataset, harness.measure.pelt_l1
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])  # noqa: E731
c, t = cpu(), time.perf_counter(); rc = main(["history", *sys.argv[1:]]); assert rc == 0
print("TIMED", time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, cpu() - c)
"""
#: what `history` does to a run that is new: read it (the strict loader) and write its entry, in a process of its own
INGEST_SCRIPT = """
import resource, sys, time, warnings; warnings.simplefilter("ignore")
from pathlib import Path
from harness.history.index import INDEX_DIR, read_run
from harness.history.index_store import ParquetStore
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])  # noqa: E731
run = Path(sys.argv[1]); store = ParquetStore(run.parent / INDEX_DIR)
c, t = cpu(), time.perf_counter(); store.put(read_run(run)); print("ingested", run.name)
print("TIMED", time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, cpu() - c)
"""
#: today's path: every results.csv (and, for the noise model, samples.csv) read into one frame per call
CSV_SCRIPT = """
import resource, sys, time, warnings; warnings.simplefilter("ignore")
from harness.history.stored import history_text, load_history
from harness.history.noise import key_spreads
from harness.history.changes import detect_changes
import harness.measure.pelt_l1
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])  # noqa: E731
c, t = cpu(), time.perf_counter(); h = load_history(sys.argv[1]); what = sys.argv[2]
if what == "history": print(history_text(h).splitlines()[-1])
if what == "noise": [key_spreads(h[h.testbed_id == t]) for t in sorted(set(h.testbed_id.dropna()))]; print("ok")
if what == "changes": print(len(detect_changes(h)), "changes")
print("TIMED", time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, cpu() - c)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("real_run", type=Path)
    ap.add_argument("--out", type=Path, default=Path("/tmp/history-index-bench"))
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 200, 400, 800, 1500])
    ap.add_argument("--csv-upto", type=int, default=200, help="time today's CSV path up to this many runs")
    ap.add_argument("--changes-upto", type=int, default=1500, help="time --changes up to this many runs")
    ap.add_argument("--check", type=int, default=8, help="runs ingested for real to check the written entries")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    root = args.out / "results"
    shutil.rmtree(args.out, ignore_errors=True)
    root.mkdir(parents=True)
    rows, env = template(args.real_run)
    timed = (pd.to_numeric(rows.latency_ms, errors="coerce") > 0).to_numpy()
    timed_keys = rows.loc[timed, list(KEY)].reset_index(drop=True)
    store, rng, made, firsts, results = ParquetStore(root / INDEX_DIR), np.random.default_rng(0), 0, {}, []
    print(f"template: {len(rows)} rows, {timed.sum()} timed, from {args.real_run}; load {os.getloadavg()}",
          flush=True)
    t0 = time.perf_counter()
    for size in args.sizes:
        while made < size:
            v = run_values(made, timed_keys, rng)
            run = write_run(root, rows, env, timed, v)
            tb = v["testbed"]
            if tb not in firsts:  # this testbed's first run: ingested for real, the model of the others
                entry = read_run(run)
                f = pd.Series(v["factor"], index=pd.MultiIndex.from_frame(timed_keys))
                pos = entry.rows.latency_ms > 0
                base_ms = pd.Series(entry.rows.loc[pos, "latency_ms"].to_numpy() / f.reindex(
                    pd.MultiIndex.from_frame(entry.rows.loc[pos, list(KEY)])).to_numpy(),
                    index=pd.MultiIndex.from_frame(entry.rows.loc[pos, list(KEY)]))
                base_rounds = entry.rounds.latency_ms / f.reindex(
                    pd.MultiIndex.from_frame(entry.rounds[list(KEY)])).to_numpy()
                firsts[tb] = (entry, base_ms, base_rounds)
                store.put(entry)
            else:
                entry, base_ms, base_rounds = firsts[tb]
                store.put(cloned(entry, run, {**v, "base_ms": base_ms, "base_rounds": base_rounds}, timed_keys))
            made += 1
        print(f"{size} runs written and indexed ({time.perf_counter() - t0:.0f} s so far)", flush=True)
        point = {"runs": size, "rows": size * len(rows), "load": os.getloadavg()[0]}
        # one new run: written, then ingested by `history` (sync reads only it)
        v = run_values(made, timed_keys, rng)
        write_run(root, rows, env, timed, v, as_harness=True)
        made += 1
        t, c = time.perf_counter(), time.process_time()
        entry = read_run(root / v["name"])
        store.put(entry)
        point["ingest_one_s"], point["ingest_one_cpu_s"] = time.perf_counter() - t, time.process_time() - c
        print(f"  ingest of one new run (in this process): {point['ingest_one_s']:.2f} s, "
              f"{point['ingest_one_cpu_s']:.2f} CPU s", flush=True)
        v = run_values(made, timed_keys, rng)  # another new run, ingested by a process of its own (as `history`)
        run = write_run(root, rows, env, timed, v, as_harness=True)
        made += 1
        wall, gb, cpu, _ = measure(INGEST_SCRIPT, str(run))
        point["ingest_s"], point["ingest_gb"], point["ingest_cpu_s"] = wall, gb, cpu
        print(f"  ingest of one new run (own process): {wall:.2f} s, {gb:.2f} GB, {cpu:.2f} CPU s", flush=True)
        for what, flags in (("history", []), ("noise", ["--noise"]), ("changes", ["--changes"])):
            if what == "changes" and size > args.changes_upto:
                continue
            wall, gb, cpu, tail = measure(INDEX_SCRIPT, str(root), *flags)
            point[f"{what}_s"], point[f"{what}_gb"], point[f"{what}_cpu_s"] = wall, gb, cpu
            print(f"  index {what}: {wall:.1f} s, {gb:.2f} GB, {cpu:.1f} CPU s ({tail})", flush=True)
            if size <= args.csv_upto and (what != "changes" or size <= min(args.csv_upto, args.changes_upto)):
                wall, gb, cpu, tail = measure(CSV_SCRIPT, str(root), what)
                point[f"csv_{what}_s"], point[f"csv_{what}_gb"], point[f"csv_{what}_cpu_s"] = wall, gb, cpu
                print(f"  csv   {what}: {wall:.1f} s, {gb:.2f} GB ({tail})", flush=True)
        point["load_after"] = os.getloadavg()[0]
        results.append(point)
        print(json.dumps(point), flush=True)
    # the written entries are what an ingest gives: a sample of runs read for real
    names = sorted(p.name for p in root.iterdir() if p.name.startswith("night"))
    for name in rng.choice(names, size=min(args.check, len(names)), replace=False):
        real, written = read_run(root / name), store.manifests()[name]
        ix = ParquetStore(root / INDEX_DIR)._read("rows", [name], list(real.rows.columns), None)
        a = real.rows.sort_values(list(KEY)).reset_index(drop=True)
        b = ix.sort_values(list(KEY)).reset_index(drop=True)[list(a.columns)]
        np.testing.assert_allclose(a.latency_ms.astype(float), b.latency_ms.astype(float), rtol=1e-12)
        assert (a.run_id.astype(str) == b.run_id.astype(str)).all() and written["summary"] == json.loads(
            json.dumps(real.manifest["summary"], default=str)), name
    print(f"checked {min(args.check, len(names))} written entries against a real ingest", flush=True)
    (args.out.parent / "history_index_bench.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out.parent / "history_index_bench.png")
    if not args.keep:
        shutil.rmtree(args.out)


def plot(results: list[dict], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(7, 3.5), layout="tight")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    df = pd.DataFrame(results)
    for col, style in (("history_s", "o-"), ("noise_s", "s-"), ("changes_s", "^-"), ("ingest_one_s", "x-"),
                       ("history_cpu_s", "o:"), ("noise_cpu_s", "s:"), ("changes_cpu_s", "^:"),
                       ("ingest_one_cpu_s", "x:"), ("csv_history_s", "o--"), ("csv_noise_s", "s--"),
                       ("csv_changes_s", "^--")):
        if col in df and df[col].notna().any():
            label = col.replace("_cpu_s", " (CPU s)").replace("_s", " (wall s)")
            ax.plot(df.runs, df[col], style, label=label)
    ax.set_xlabel("runs (5,000 rows each)")
    ax.set_ylabel("seconds (wall at the load of the day; CPU)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
