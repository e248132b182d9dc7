"""`python -m harness recommend`: the deployment advisor's command and its terminal presentation."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from harness.masks import MASK_NAMES

SHAPE_FLAGS = ("batch", "heads", "kv_heads", "seq", "seq_k", "head_dim")


def _bytes(n: float) -> str:
    if not isinstance(n, (int, float)) or not math.isfinite(n):
        return "-"
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def _compiles(row: pd.Series) -> str:
    value = row.get("compiles")
    if not isinstance(value, str):
        return "-"
    breaks = row.get("graph_breaks")
    if value == "no":
        return "no (eager)" if pd.isna(breaks) else f"no ({int(breaks)} break{'s' if breaks != 1 else ''})"
    return value


def _mask(row: pd.Series) -> str:
    path = row.get("mask_path")
    if path == "dense":
        return f"dense {_bytes(row.get('dense_mask_bytes'))}"
    return path if isinstance(path, str) else "-"


def _vs_anchor(row: pd.Series) -> str:
    """How the row compared with the fastest of its tie group, which decided the tie."""
    if row.timing_verdict == "anchor":
        return "(fastest)"
    return f"{row.timing_verdict} p={_num(row.p_value, '.2g')}"


def _num(value: float, fmt: str, suffix: str = "") -> str:
    return format(value, fmt) + suffix if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def format_table(df: pd.DataFrame) -> str:
    """The ranked backends, the winner and why, the ties, every exclusion with its reason, and the check notes."""
    a = df.attrs
    kind = "training (fwd+bwd)" if a.get("phase") == "fwd+bwd" else "inference (fwd)"
    name = a.get("workload")
    shape = a.get("case_id") if name == a.get("case_id") else f"{name} ({a.get('case_id')})"
    threads = f"{a.get('threads')} thread" + ("s" if a.get("threads") != 1 else "")
    lines = [f"workload {shape}: {kind} on {a.get('device')} ({a.get('device_name')}, {threads})"]
    lines += [f"  note: {n}" for n in a.get("notes", [])]
    ranked = df[df["rank"].notna()]
    if len(ranked):
        show = pd.DataFrame({
            "rank": ranked["rank"].astype(int), "tie": ranked.tie_group.astype(int), "backend": ranked.backend,
            "err_ratio": ranked.err_ratio.map(lambda v: _num(v, ".3g")),
            "latency_ms": ranked.latency_ms.map(lambda v: _num(v, ".4g")),
            "iqr_ms": ranked.iqr_ms.map(lambda v: _num(v, ".2g")),
            "vs_fastest": ranked.vs_fastest.map(lambda v: _num(v, ".2f", "x")),
            "vs_group_fastest": ranked.apply(_vs_anchor, axis=1),
            "peak_mem": ranked.peak_mem_bytes.map(_bytes),
            "fullgraph": ranked.apply(_compiles, axis=1),
            "cuda_graph": ranked.get("cuda_graph", pd.Series("-", index=ranked.index)).fillna("-"),
            "determ": ranked.get("deterministic", pd.Series("-", index=ranked.index)).fillna("-"),
            "mask": ranked.apply(_mask, axis=1), "deps": ranked.deps})
        lines.append(show.to_string(index=False))
    lines.append(f"winner: {a.get('explanation')}")
    ties = [f"{{{', '.join(g.backend)}}}" for _, g in ranked.groupby("tie_group") if len(g) > 1]
    lines.append("tied within noise (same tie group): " + ("; ".join(ties) if ties else "none"))
    excluded = df[df["rank"].isna()]
    if len(excluded):
        lines.append("excluded:")
        width = max(len(b) for b in excluded.backend)
        lines += [f"  {r.backend:<{width}}  {r.status:<11}  {r.reason}" for r in excluded.itertuples()]
    notes = [(r.backend, r.compile_note) for r in ranked.itertuples()
             if getattr(r, "compiles", "yes") != "yes" and isinstance(getattr(r, "compile_note", None), str)]
    if notes:
        lines.append(f"fullgraph notes (checked on {a.get('check_case')}):")
        lines += [f"  {name}: {note}" for name, note in notes]
    return "\n".join(lines)


def format_overall(df: pd.DataFrame) -> str:
    """The per-backend summary over every workload of a file, and the overall pick with its reason."""
    show = df.assign(overall_rank=df.overall_rank.map(lambda v: "-" if pd.isna(v) else str(int(v))),
                     geomean_rank=df.geomean_rank.map(lambda v: _num(v, ".2f")),
                     geomean_vs_fastest=df.geomean_vs_fastest.map(lambda v: _num(v, ".2f", "x")))
    return "overall:\n" + show.to_string(index=False) + f"\noverall winner: {df.attrs.get('explanation')}"


def _recommend(args: argparse.Namespace) -> int:
    import torch

    from harness.backends.base import load_backend_module
    from harness.recommend import TIMING, Workload, load_workloads, recommend_many
    from harness.timing import TimingConfig

    for module in args.backend_module:
        load_backend_module(module)
    if args.threads is not None:  # CPU latency depends on it; recorded in each table's header
        if args.threads < 1:
            raise ValueError(f"--threads {args.threads!r}: must be >= 1")
        torch.set_num_threads(args.threads)
    given = [f"--{f.replace('_', '-')}" for f in SHAPE_FLAGS if getattr(args, f) is not None]
    if args.workload:
        if given:
            raise ValueError(f"--workload {args.workload} describes the shapes; drop {', '.join(given)}")
        workloads = load_workloads(args.workload, training=True if args.training else None)
    else:
        need = [f"--{f.replace('_', '-')}" for f in ("batch", "heads", "seq", "head_dim") if getattr(args, f) is None]
        if need:
            raise ValueError(f"recommend needs --workload FILE, or the shape: missing {', '.join(need)}")
        workloads = [Workload(args.batch, args.heads, args.seq, args.head_dim, kv_heads=args.kv_heads,
                              seq_k=args.seq_k, dtype=args.dtype, mask=args.mask, training=args.training)]
    timing = TIMING if args.timing_budget_ms is None else TimingConfig(
        warmup_ms=TIMING.warmup_ms, budget_ms=args.timing_budget_ms, min_reps=TIMING.min_reps)
    tables, total = recommend_many(workloads, backends=args.backends, device=args.device, results=args.results,
                                   seed=args.seed, timing=timing, checks=args.checks,
                                   compile_backend=args.compile_backend)
    print("\n\n".join(format_table(t) for t in tables.values()))
    if len(tables) > 1:
        print("\n" + format_overall(total))
    if args.csv:
        frames = [t.assign(workload=label) for label, t in tables.items()]
        pd.concat(frames, ignore_index=True).to_csv(args.csv, index=False)
        print(f"table: {args.csv}")
    winner = total.attrs.get("winner") if len(tables) > 1 else next(iter(tables.values())).attrs.get("winner")
    return 0 if winner else 1


def add_subcommand(subparsers: argparse._SubParsersAction) -> None:
    """Add `recommend`: exit 0 with a winner, 1 when no backend is verified and timed, 2 on bad input."""
    p = subparsers.add_parser(
        "recommend", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="rank backends for a workload on this machine: correctness, latency with ties, memory, deployment checks",
        description="Verifies every backend on the workload against the float64 reference, times the verified ones "
                    "(fwd, or fwd+bwd with --training), ranks them with ties judged by compare's statistics, and "
                    "runs deployment checks (fullgraph compile on a small shape, CUDA-graph capture, determinism, "
                    "mask path).")
    shape = p.add_argument_group("workload (or --workload FILE)")
    shape.add_argument("--batch", type=int)
    shape.add_argument("--heads", type=int, help="query heads")
    shape.add_argument("--kv-heads", type=int, help="key/value heads (GQA when fewer than --heads; default: --heads)")
    shape.add_argument("--seq", type=int, help="query length (and key length unless --seq-k)")
    shape.add_argument("--seq-k", type=int, help="key length (default: --seq)")
    shape.add_argument("--head-dim", type=int)
    shape.add_argument("--dtype", default="bf16", help="fp32, fp16, bf16 or fp64")
    shape.add_argument("--mask", default="causal", help=f"one of {', '.join(MASK_NAMES)}")
    shape.add_argument("--training", action="store_true", help="time forward+backward (default: forward only)")
    shape.add_argument("--workload", type=Path, default=None,
                       help="a .toml (or .yaml with PyYAML) file: [defaults] and [[shape]] tables; one recommendation "
                            "per shape and an overall one")
    p.add_argument("--results", type=Path, default=None,
                   help="a run dir to take the workload's verdicts and samples from when it was measured there on "
                        "this testbed; otherwise they are measured now")
    p.add_argument("--backends", default="all", help="comma-separated backend names or 'all'")
    p.add_argument("--backend-module", action="append", default=[], help="module or .py path registering backends")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's own)")
    p.add_argument("--timing-budget-ms", type=float, default=None, help="time budget per backend (default: 500)")
    p.add_argument("--checks", action=argparse.BooleanOptionalAction, default=True,
                   help="run the deployment checks (--no-checks: correctness and timing only)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the fullgraph check")
    p.add_argument("--csv", type=Path, default=None, help="also write the table(s) to this CSV")
    p.set_defaults(func=_recommend)
