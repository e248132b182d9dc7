"""Refit a device type's unit costs (harness/planning/unit_costs.json, what the whole-job estimate, fuzzing's plan
and selftest's estimates price at) from runs' stage clocks - never copied by hand.

    python scripts/refit_rates.py RUN_DIR [RUN_DIR ...] [--entry cuda] [--write]

Pooled over the runs given (each run's env.json time_spent: harness.measure.stages, with its counts; results.csv):
- key_round_s: the benchmark stage's seconds per timed round, less the round's timing budget (the model prices
  the budget as the round's calls);
- call_s: the correctness stage's seconds per (case, backend) checked, less its float64 references, naive
  baselines, judging and the calls' own forward and backward (the model prices those from FLOP rates);
- judged_per_s: the answer elements the correctness stage judged (out - twice where a backward ran: the no-grad
  call's and the training call's - and dq, dk, dv) per second of its judging.
The other costs are kept. Prints the entry's old and new costs; --write rewrites the entry ('fitted' names the runs,
and 'extrapolated' keeps only what is still not measured). --entry: default the runs' device type ('cpu', 'cuda').
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from harness.cases.case import AttentionCase, answer_elements
from harness.cases.case_id import parse_case_id
from harness.measure.stages import COUNT_CHECKED, COUNT_TIMED
from harness.planning.rates import UNIT_COSTS
from harness.store.load import load_results
from harness.store.run_dir import read_env
from harness.store.schema import BWD, FWD, JUDGED

#: the three costs a run's stage clocks measure, and the stages a correctness call's own arithmetic is charged to
REFIT = ("key_round_s", "call_s", "judged_per_s")
ARITHMETIC = ("reference", "naive baseline", "judging", "forward", "backward")


def judged_elements(results) -> int:
    """Answer elements the correctness stage judged, from its rows (a probe's, keyed 'tag:<case id>', apart)."""
    rows = results[results["status"].isin(JUDGED)]
    judged = {(r.case_id, r.backend, r.phase) for r in rows.itertuples() if ":" not in r.case_id}
    total = 0
    for case_id, backend, phase in judged:
        case = shapes_of(case_id)
        if phase == FWD:  # the no-grad call's out, and the training call's too where it had one
            total += answer_elements(case, FWD) * (2 if (case_id, backend, BWD) in judged else 1)
        else:
            total += answer_elements(case, BWD)
    return total


def shapes_of(case_id: str) -> AttentionCase:
    """The case's shapes alone (a mask known by its digest needs no rebuilding to count its answers)."""
    f = parse_case_id(case_id)[0]
    return AttentionCase(f["batch"], f["heads"], f["seq_q"], f["head_dim"], "fp32", kv_heads=f["kv_heads"],
                         seq_k=f["seq_k"], head_dim_v=f["head_dim_v"])


def device_type(run_dirs: list[Path]) -> str:
    """The device type every run ran on ('cpu', 'cuda'); SystemExit when they differ or one counted nothing."""
    types = set()
    for run in run_dirs:
        env = read_env(run)
        if not (env.get("time_spent") or {}).get("counts"):
            raise SystemExit(f"{run}: its env.json has no counts in time_spent (a run before 2026-12-07); run again")
        types.add(str(env.get("device", "cpu")).split(":")[0])
    if len(types) != 1:
        raise SystemExit(f"the runs are of several device types ({', '.join(sorted(types))}): refit one at a time")
    return types.pop()


def measured(run_dirs: list[Path]) -> tuple[dict[str, float], list[str]]:
    """(the refit costs the runs measure, what each was measured from)."""
    sums = dict(bench_s=0.0, rounds=0, budget_s=0.0, check_s=0.0, checked=0, judging_s=0.0, elements=0)
    for run in run_dirs:
        spent = read_env(run)["time_spent"]
        counts, tests, stages = spent["counts"], spent.get("tests_s") or {}, spent.get("stages") or {}
        if counts.get(COUNT_TIMED) and tests.get("benchmark"):
            sums["bench_s"] += tests["benchmark"]
            sums["rounds"] += counts[COUNT_TIMED]
            sums["budget_s"] += counts[COUNT_TIMED] * (spent.get("round_budget_ms") or 0.0) / 1e3
        if counts.get(COUNT_CHECKED) and tests.get("correctness"):
            sums["check_s"] += tests["correctness"] - sum(stages.get(s, {}).get("s", 0.0) for s in ARITHMETIC)
            sums["checked"] += counts[COUNT_CHECKED]
            sums["judging_s"] += stages.get("judging", {}).get("s", 0.0)
            sums["elements"] += judged_elements(load_results(Path(run) / "results.csv"))
    costs, sources = {}, []
    if sums["rounds"]:
        costs["key_round_s"] = max(0.0, (sums["bench_s"] - sums["budget_s"]) / sums["rounds"])
        sources.append(f"key_round_s over {sums['rounds']} timed rounds")
    if sums["checked"]:
        costs["call_s"] = max(0.0, sums["check_s"] / sums["checked"])
        sources.append(f"call_s over {sums['checked']} cases and backends checked")
    if sums["judging_s"] > 0 and sums["elements"]:
        costs["judged_per_s"] = sums["elements"] / sums["judging_s"]
        sources.append(f"judged_per_s over {sums['elements']:.3g} elements")
    return costs, sources


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (results/<run id>)")
    parser.add_argument("--entry", help="the entry of unit_costs.json to refit (default: the runs' device type)")
    parser.add_argument("--write", action="store_true", help="rewrite the entry in the unit costs file")
    parser.add_argument("--file", type=Path, default=UNIT_COSTS, help="the unit costs file (default: the package's)")
    args = parser.parse_args(argv)
    kind = device_type(args.runs)
    entry = args.entry or kind
    data = json.loads(args.file.read_text())
    if entry not in data or entry.startswith("_"):
        raise SystemExit(f"--entry {entry!r}: allowed: {', '.join(k for k in data if not k.startswith('_'))}")
    if data[entry]["device_type"] != kind:
        raise SystemExit(f"--entry {entry!r} is a {data[entry]['device_type']} entry; the runs are {kind}")
    costs, sources = measured(args.runs)
    if not costs:
        raise SystemExit("the runs measured none of " + ", ".join(REFIT) + " (no correctness or benchmark stage)")
    for name, value in costs.items():
        print(f"{entry}.{name}: {data[entry][name]:.4g} -> {value:.4g}")
    if args.write:
        data[entry].update({name: float(f"{value:.4g}") for name, value in costs.items()})
        runs = ", ".join(Path(r).name for r in args.runs)
        data[entry]["fitted"] = (f"{datetime.date.today()}: {', '.join(sources)} of run(s) {runs} "
                                 f"(scripts/refit_rates.py); the other costs: {data[entry]['fitted']}")
        left = [n for n in REFIT if n not in costs]
        if data[entry].get("extrapolated"):
            data[entry]["extrapolated"] = (f"{', '.join(left)} not yet measured on a {kind}" if left else "")
        args.file.write_text(json.dumps(data, indent=1) + "\n")
        print(f"written: {args.file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
