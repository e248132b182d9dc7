"""Presentation of a compare: terminal table, compare.csv, compare.md and a PNG of per-case latency ratios."""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np
import pandas as pd

from harness.compare.runs import Comparison, ratio_spread
from harness.measure.pooled import scope
from harness.store.schema import (BETTER, FASTER, LOST, MISSING, NEW_ONLY, NOT_TIMED, REJECTED, SAME, SLOWER,
                                  UNCHANGED, UNDECIDED, WORSE)

#: rows worth showing first, in this order; "unchanged"/"not-timed" with "same" correctness are only counted
_ORDER = {SLOWER: 0, REJECTED: 0, MISSING: 1, UNDECIDED: 2, FASTER: 3, NEW_ONLY: 5, UNCHANGED: 6, NOT_TIMED: 7}
_SHOWN = ["case_id", "backend", "phase", "verdict", "correctness", "base_ms", "new_ms", "ratio", "interval",
          "margin", "rounds", "note"]


def header(cmp: Comparison) -> str:
    cfg, base, new = cmp.config, cmp.base, cmp.new
    if cmp.mode == "cross-device":
        title = (f"cross-device comparison (not a regression gate): base {base.device_name} "
                 f"[{base.testbed}] vs new {new.device_name} [{new.testbed}]")
    else:
        title = f"regression gate on testbed {base.testbed} ({base.device_name})"
    noise = (f"margins from {cmp.noise.path}" if cmp.noise is not None else
             "no noise model for this testbed (build one: history --noise): margin = min effect")
    level = (f"{cmp.key_confidence:.4g} interval (family-wise over the keys timed in both runs)"
             if cmp.key_confidence > cfg.confidence else f"{cfg.confidence:.0%} interval")
    rule = (f"slower: the {level} of the round-median ratio (Hodges-Lehmann) excludes 1 and "
            f"the ratio exceeds the key's margin (max of {1 + cfg.min_effect:.3g}x and {cfg.noise_z:g} A/A sigma; "
            f"{noise}); undecided: beyond the margin, interval includes 1; correctness worse: "
            f"pass->fail/error/oom, new NaN/inf, err_ratio +{cfg.err_growth}; missing keys fail the gate"
            + (" (allowed here)" if cmp.allow_missing else ""))
    if cmp.rows.remeasured.astype(bool).any():
        rule += ("\nre-measured keys (*): decided on their fresh rounds - in pairs with the base code when it was "
                 "timed too (a signed-rank interval on the pairs' log ratios at the family-wise level, margin "
                 f"{1 + cfg.min_effect:.3g}x; undecided while the machine's noise is too large), see each note")
    warn = "".join(f"\nWARNING {w}: timing verdicts may be noise" for w in cmp.warnings)
    warn += "".join(f"\nNOTE {n}" for n in cmp.notes)
    return f"{title}\nbase: {base.run_dir}\nnew:  {new.run_dir}\n{rule}{warn}"


def notable(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that are not plainly unchanged, regressions first."""
    keep = df[(~df.verdict.isin([UNCHANGED, NOT_TIMED])) | (~df.correctness.isin([SAME, ""]))]
    # numeric even when nothing is notable: an empty map of a string column stays a (pyarrow) string column
    rank = keep.verdict.map(_ORDER).astype(float).fillna(9) - 10 * keep.regression.astype(int)
    return keep.assign(_rank=rank).sort_values(["_rank", "ratio"], ascending=[True, False]).drop(columns="_rank")


def summary(cmp: Comparison) -> str:
    df = cmp.rows
    counts = df.verdict.value_counts()
    timing = ", ".join(f"{v} {counts[v]}" for v in _ORDER if v in counts)
    corr = df.correctness.value_counts()
    correctness = ", ".join(f"{v} {corr[v]}" for v in (WORSE, LOST, BETTER) if v in corr) or "no changes"
    undecided = len(cmp.undecided)
    unconfirmed = int(((df.verdict == SLOWER) & ~df.remeasured.astype(bool) & df.regression).sum())
    pending = int((~cmp.undecided.remeasured.astype(bool)).sum())
    slower = cmp.slower_groups
    groups = "; ".join(f"{scope(g.backend, g.phase)} slower as a whole ({g.note})"
                       for g in slower.itertuples())
    gate = (f"REGRESSION: {int(df.regression.sum())} row(s)"
            + (f" ({unconfirmed} slower from the runs' own rounds only: compare --remeasure confirms or refutes "
               "them)" if unconfirmed else "") + (f"; {groups}" if groups else "") if cmp.regression else
            "cross-device report: no gate" if cmp.mode != "gate" else
            f"no regression, but {undecided} undecided key(s): "
            + (cmp.remeasure_next if cmp.remeasure_next else
               f"re-measure them (python -m harness compare {cmp.base.run_dir} {cmp.new.run_dir} --remeasure) or run "
               "more --rounds" if pending else
               "the re-measurement could not settle them (each row's note says what would)")
            if undecided else "no regression")
    spread = ratio_spread(cmp)
    noise = (f"; |ratio-1| of timed rows: median {spread[0]:.1%}, 90th pct {spread[1]:.1%}" if spread else "")
    return f"{len(df)} rows; timing: {timing}{noise}; correctness: {correctness}; {gate}"


def _fmt(df: pd.DataFrame) -> pd.DataFrame:
    out = df.assign(
        interval=[("" if pd.isna(lo) else f"{lo:.3f}-{hi:.3f}") for lo, hi in zip(df.ratio_low, df.ratio_high)],
        rounds=[("" if pd.isna(b) else f"{b:.0f}/{n:.0f}" + ("*" if r is True else ""))
                for b, n, r in zip(df.rounds_base, df.rounds_new, df.remeasured)])[_SHOWN].copy()
    for col, spec in (("base_ms", ".4g"), ("new_ms", ".4g"), ("ratio", ".3f"), ("margin", ".3f")):
        out[col] = out[col].map(lambda x, spec=spec: "" if pd.isna(x) else format(x, spec))
    return out.fillna("")


def group_table(cmp: Comparison) -> str:
    """The backend-level verdicts of a paired re-measurement, one line each ('' when none was made)."""
    if cmp.groups is None or cmp.groups.empty:
        return ""
    lines = ["backends as a whole (keys' paired log ratios pooled: a sign-test interval of the keys' median; the "
             "groups' own 5 % family level, split over the groups and halved at each look):"]
    for g in cmp.groups.itertuples():
        lines.append(f"  {scope(g.backend, g.phase)}: {g.verdict} - {g.note}")
    return "\n".join(lines)


def terminal_table(cmp: Comparison, limit: int = 60) -> str:
    rows = notable(cmp.rows)
    lines = [header(cmp), ""] + ([group_table(cmp), ""] if group_table(cmp) else [])
    if rows.empty:
        lines.append("every row unchanged")
    else:
        lines.append(_fmt(rows.head(limit)).to_string(index=False, max_colwidth=70))
        if len(rows) > limit:
            lines.append(f"... {len(rows) - limit} more notable rows in compare.csv")
    return "\n".join([*lines, "", summary(cmp)])


def markdown(cmp: Comparison) -> str:
    """All notable rows as a Markdown table (pandas' to_markdown needs tabulate; this does not)."""
    rows = _fmt(notable(cmp.rows))
    head = "| " + " | ".join(rows.columns) + " |\n|" + "---|" * len(rows.columns) + "\n"
    # cells come from data (backend names, reasons): escaped, so no raw HTML reaches a rendered page
    cells = (" | ".join(html.escape(str(v), quote=False).replace("|", "\\|") for v in r)
             for r in rows.itertuples(index=False))
    body = "".join(f"| {line} |\n" for line in cells)
    text = "# " + html.escape(header(cmp), quote=False).replace("\n", "\n\n") + "\n\n" + summary(cmp) + "\n\n"
    if group_table(cmp):
        text += "```\n" + group_table(cmp) + "\n```\n\n"
    return text + (head + body if len(rows) else "Every row unchanged.\n")


#: tick candidates of the ratio axis, most wanted first: 1x always, then the round factors
_TICKS = (1, 2, 0.5, 4, 0.25, 10, 0.1, 100, 0.01, 1.5, 0.67, 3, 0.33, 1.25, 0.8, 1.1, 0.9, 1.05, 0.95)
#: fewest ticks' worth of room between two tick labels: the axis' log width over this many
_TICK_ROOM = 9


def ratio_ticks(lo: float, hi: float) -> list[float]:
    """Ticks of a log ratio axis from lo to hi, 1x first, no two closer than 1/_TICK_ROOM of its log width."""
    if not (0 < lo < hi and math.isfinite(hi)):
        return [1.0]
    room = (math.log(hi) - math.log(lo)) / _TICK_ROOM
    chosen: list[float] = []
    for t in _TICKS:
        if lo <= t <= hi and all(abs(math.log(t / c)) >= room for c in chosen):
            chosen.append(t)
    return sorted(chosen)


def ratio_figure(cmp: Comparison):
    """Dot plot of new/base ratios per key, log scale (a Figure on an Agg canvas); None if nothing was timed."""
    df = cmp.rows
    timed = df[np.isfinite(df.ratio.astype(float))].sort_values("ratio")
    if timed.empty:
        return None
    import matplotlib.ticker
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    colors = {SLOWER: "tab:red", FASTER: "tab:green", UNCHANGED: "tab:gray", UNDECIDED: "tab:orange"}
    labels = [f"{r.backend} {r.case_id} [{r.phase}]" for r in timed.itertuples()]
    fig = Figure(figsize=(9, max(2.5, 0.22 * len(timed) + 1.2)), layout="tight")
    FigureCanvasAgg(fig)  # Agg canvas, no pyplot: no global state, works headless and in threads
    ax = fig.add_subplot()
    y = np.arange(len(timed))
    ax.scatter(timed.ratio, y, c=[colors.get(v, "black") for v in timed.verdict], s=18, zorder=3)
    # an interval to inf (a wild re-measurement) is drawn to the plot's edge, not to a non-finite coordinate
    finite = timed.ratio.astype(float)
    low, high = (timed[c].astype(float).clip(finite.min() / 10, finite.max() * 10).fillna(finite)
                 for c in ("ratio_low", "ratio_high"))
    ax.hlines(y, low, high, color="gray", lw=0.8, zorder=2)
    ax.scatter(timed.margin.astype(float), y, marker="|", c="black", s=30, zorder=2)  # each key's own margin
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xscale("log")
    ticks = ratio_ticks(*ax.get_xlim())
    ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_yticks(y, labels, fontsize=6)
    ax.set_xlabel("new / base round-median ratio with its interval (log scale; |: the key's margin)")
    for verdict, color in colors.items():
        ax.scatter([], [], c=color, s=18, label=verdict)
    ax.legend(fontsize=7, loc="best")
    devices = f"cross-device: {cmp.new.device_name} vs {cmp.base.device_name}, " if cmp.mode == "cross-device" else ""
    ax.set_title(f"{devices}latency ratio per (case, backend, phase)", fontsize=8)
    return fig


def write_report(cmp: Comparison, out_dir: str | Path) -> dict[str, Path]:
    """compare.csv (every row), compare.md (notable rows) and compare.png (ratios) under out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"csv": out_dir / "compare.csv", "md": out_dir / "compare.md"}
    cmp.rows.to_csv(files["csv"], index=False)
    if cmp.groups is not None:
        files["backends"] = out_dir / "compare-backends.csv"
        cmp.groups.to_csv(files["backends"], index=False)
    files["md"].write_text(markdown(cmp))
    fig = ratio_figure(cmp)
    if fig is not None:
        files["png"] = out_dir / "compare.png"
        fig.savefig(files["png"], dpi=120)
    return files
