"""The advisor's terminal presentation: the ranked table, the winner and why, ties, exclusions, check notes."""

from __future__ import annotations

import math

import pandas as pd

from harness.advisor.ranking import Overall, Recommendation
from harness.store.schema import FWD_BWD


def _bytes(n: float) -> str:
    if not isinstance(n, (int, float)) or not math.isfinite(n):
        return "-"
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def _compiles(row: pd.Series) -> str:
    value, breaks = row.get("compiles"), row.get("graph_breaks")
    if value != "no":
        return value if isinstance(value, str) else "-"
    return "no (eager)" if pd.isna(breaks) else f"no ({int(breaks)} break{'s' if breaks != 1 else ''})"


def _mask(row: pd.Series) -> str:
    path = row.get("mask_path")
    if path == "dense":
        return f"dense {_bytes(row.get('dense_mask_bytes'))}"
    return path if isinstance(path, str) else "-"


def _text(rows: pd.DataFrame, column: str) -> pd.Series:
    """A check column as text, '-' where it was not run."""
    return rows[column].astype(object).where(rows[column].notna(), "-")


def _vs_anchor(row: pd.Series, alpha: float) -> str:
    """How the row compared with the fastest of its tie group; only group 1's anchor is the fastest overall. The p
    is printed with the level it was held to, so a tie beside p=0.007 reads as what it is (0.007 is not < 0.002)."""
    if row.timing_verdict == "anchor":
        return "fastest overall" if row.tie_group == 1 else f"fastest of tie group {int(row.tie_group)}"
    p = row.p_value
    held = "" if not math.isfinite(p) else f" {'<' if p < alpha else '>='} {alpha:g}"
    return f"vs {row.anchor}: {row.timing_verdict} p={_num(p, '.2g')}{held}"


def _num(value: float, fmt: str, suffix: str = "") -> str:
    return format(value, fmt) + suffix if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def format_table(rec: Recommendation) -> str:
    """The ranked backends, the winner and why, the ties, every exclusion with its reason, and the check notes."""
    df = rec.table
    kind = "training (fwd+bwd)" if rec.phase == FWD_BWD else "inference (fwd)"
    shape = rec.case_id if rec.workload == rec.case_id else f"{rec.workload} ({rec.case_id})"
    threads = f"{rec.threads} thread" + ("s" if rec.threads != 1 else "")
    lines = [f"workload {shape}: {kind} on {rec.device} ({rec.device_name}, {threads})"]
    lines += [f"  note: {n}" for n in rec.notes]
    ranked = df[df["rank"].notna()]
    if len(ranked):
        show = pd.DataFrame({
            "rank": ranked["rank"].astype(int), "tie": ranked.tie_group.astype(int), "backend": ranked.backend,
            "err_ratio": ranked.err_ratio.map(lambda v: _num(v, ".3g")),
            "latency_ms": ranked.latency_ms.map(lambda v: _num(v, ".4g")),
            "iqr_ms": ranked.iqr_ms.map(lambda v: _num(v, ".2g")), "GB/s": ranked.gbps.map(lambda v: _num(v, ".4g")),
            "%bw": ranked.pct_of_bw_peak.map(lambda v: _num(v, ".3g", "%")),
            "vs_fastest": ranked.vs_fastest.map(lambda v: _num(v, ".2f", "x")),
            "vs_tie_group": ranked.apply(_vs_anchor, axis=1, alpha=rec.alpha), "peak_mem": ranked.peak_mem_bytes.map(_bytes),
            "fullgraph": ranked.apply(_compiles, axis=1), "cuda_graph": _text(ranked, "cuda_graph"),
            "determ": _text(ranked, "deterministic"), "batch_inv": _text(ranked, "batch_invariant"),
            "mask": ranked.apply(_mask, axis=1), "deps": ranked.deps})
        lines.append(show.to_string(index=False))
    lines.append(f"winner: {rec.explanation}")
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
        lines.append(f"fullgraph notes (checked on {rec.check_case}):")
        lines += [f"  {name}: {note}" for name, note in notes]
    return "\n".join(lines)


def format_overall(result: Overall) -> str:
    """The per-backend summary over every workload of a file, and the overall pick with its reason."""
    df = result.table
    show = df.assign(overall_rank=df.overall_rank.map(lambda v: "-" if pd.isna(v) else str(int(v))),
                     geomean_rank=df.geomean_rank.map(lambda v: _num(v, ".2f")),
                     geomean_vs_fastest=df.geomean_vs_fastest.map(lambda v: _num(v, ".2f", "x")))
    return "overall:\n" + show.to_string(index=False) + f"\noverall winner: {result.explanation}"
