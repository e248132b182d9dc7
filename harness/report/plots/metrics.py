"""Figures of one quantity per backend: against sequence length where a case family has several, per case otherwise."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import LogFormatterSciNotation, NullFormatter

from harness.report.plots.style import backend_color, backend_label, backend_style, new_figure
from harness.report.analysis import case_label, group_label, split_series
from harness.report.data import Run, peak_tflops
from harness.store.schema import PHASES, VERDICT_PHASES

GROUPS_PER_PAGE = 4  # rows of panels per PNG: more makes labels unreadable at report width
CASES_PER_PAGE = 48  # columns of a per-case dot plot before its labels overlap


@dataclass(frozen=True)
class Metric:
    """One y quantity: a panel per (shape group, phase) against seq_k, and a per-case panel per phase. `title` may
    name {baseline}."""

    name: str
    title: str
    column: str
    ylabel: str
    log_y: str = "auto"  # "always" for quantities whose scaling law is the point (memory)
    log_x: str = "auto"
    skip_baseline: bool = False
    decorate: Callable[[Axes, pd.DataFrame, Run], None] | None = None  # panels against seq_k
    case_decorate: Callable[[Axes, pd.DataFrame, Run], None] | None = None  # per-case panels (x = rows.xpos)
    case_title: str = ""
    iqr: bool = False
    timing_flags: bool = True  # ring noisy / cross suspicious timings: only where the y value comes from a timing
    phases: tuple[str, ...] = PHASES


def _spans_decades(values: np.ndarray, ratio: float = 10.0) -> bool:
    values = values[np.isfinite(values) & (values > 0)]
    return len(values) > 1 and values.max() / values.min() >= ratio


def _set_seq_axis(ax: Axes, xs: np.ndarray, log: str = "auto") -> None:
    xs = np.unique(xs[np.isfinite(xs)])
    if log == "always" or _spans_decades(xs, 8):
        ax.set_xscale("log", base=2)
    if len(xs) == 1:  # room for the dodged markers around a single length
        ax.set_xlim(xs[0] / 2 ** 0.5, xs[0] * 2 ** 0.5)
    if 0 < len(xs) <= 8:  # label the lengths actually measured, as plain numbers
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("sequence length seq_k (keys)")


def _draw(ax: Axes, rows: pd.DataFrame, metric: Metric, log: bool, along_seq: bool, among: list[str]) -> None:
    """One series per backend (label = backend name), dodged sideways so equal values do not hide each other: a
    line against seq_k (by a few % of the axis), or markers within each case's column (x = rows.xpos)."""
    backends = list(dict.fromkeys(rows.backend))
    if along_seq:
        xs = rows.seq_k.to_numpy(float)
        octaves = max(1.0, float(np.log2(xs.max() / xs.min())))
    for i, (backend, g) in enumerate(rows.groupby("backend", sort=False)):
        colour, marker = backend_style(backend, among)
        offset = i - (len(backends) - 1) / 2
        if along_seq:
            g = g.sort_values("seq_k")
            x, style = g.seq_k.to_numpy(float) * 2 ** (0.03 * octaves * offset), {"lw": 1.6}
        else:
            x, style = g.xpos.to_numpy(float) + 0.7 * offset / len(backends), {"ls": "none"}
        y = g[metric.column].to_numpy(float)
        ax.plot(x, _drawable(y, log), marker=marker, color=colour, label=backend, ms=6, **style)
        _overlays(ax, g, x, y, metric, colour, log)


def _drawable(y: np.ndarray, log: bool) -> np.ndarray:
    """y without the values the axis cannot place (inf; 0 on a log axis): those go to the edges instead."""
    return np.where(np.isinf(y) | (log & (y <= 0)), np.nan, y)


def _overlays(ax: Axes, g: pd.DataFrame, x: np.ndarray, y: np.ndarray, metric: Metric, colour: str,
              log: bool) -> None:
    """Quartile bars, rings on noisy timings, crosses on suspicious ones, edge marks for values off the axis
    (all '_'-labelled: not series)."""
    edge = ax.get_xaxis_transform()  # x in data, y in axes fraction: 0 is the bottom edge, 1 the top
    for hidden, height, mark, mark_colour in ((np.isinf(y), 0.96, "$\\infty$", "red"),
                                              (log & (y == 0), 0.04, "$0$", "black")):
        if hidden.any():
            ax.scatter(x[hidden], np.full(hidden.sum(), height), transform=edge, marker=mark, s=120,
                       color=mark_colour, label="_edge", zorder=4, clip_on=False)
            ax.scatter(x[hidden], np.full(hidden.sum(), height), transform=edge, marker="o", s=160,
                       facecolors="none", edgecolors=colour, lw=1.5, label="_edge", zorder=4, clip_on=False)
            ax.dataLim.update_from_data_x(x[hidden], ignore=False)  # edge marks do not autoscale x by themselves
    y = _drawable(y, log)
    if metric.iqr and np.isfinite(g.latency_q1_ms).any():
        # the samples' own quartiles, not median ± IQR/2: skewed timings would draw negative latencies
        low = np.nan_to_num(y - g.latency_q1_ms.to_numpy(float))
        high = np.nan_to_num(g.latency_q3_ms.to_numpy(float) - y)
        ax.errorbar(x, y, yerr=[low.clip(0), high.clip(0)], fmt="none", ecolor=colour, alpha=0.6, label="_iqr")
    noisy = g.noisy_matters.to_numpy(bool) & metric.timing_flags  # data.unsettled: noisy where it matters
    suspicious = g.suspicious.to_numpy(bool) & metric.timing_flags
    if noisy.any():
        ax.scatter(x[noisy], y[noisy], s=130, facecolors="none", edgecolors="black", lw=1, label="_noisy", zorder=3)
    if suspicious.any():
        ax.scatter(x[suspicious], y[suspicious], s=150, marker="x", color="red", lw=2, label="_suspicious", zorder=4)


def metric_rows(run: Run, metric: Metric) -> pd.DataFrame:
    """The case rows that have a value to plot for `metric`."""
    df = run.cases
    df = df[df[metric.column].notna() & df.phase.isin(metric.phases)]  # inf stays: drawn at the edge, marked
    if metric.log_y == "always":
        df = df[df[metric.column] > 0]  # zero bytes (nothing above the inputs) has no place on a log axis
    if metric.skip_baseline:
        df = df[df.backend != run.baseline]
    return df


def metric_figures(run: Run, metric: Metric) -> list[tuple[str, Figure]]:
    """Shape groups measured at several lengths as lines against seq_k; every other case as a dot plot."""
    df = metric_rows(run, metric)
    if "{baseline}" in metric.title:  # only this placeholder: other braces in a title are mathtext
        metric = replace(metric, title=metric.title.format(baseline=run.baseline))
    series, singles = split_series(df)
    return _series_pages(run, metric, series) + _case_pages(run, metric, singles)


def _y_values(rows: pd.DataFrame, metric: Metric) -> np.ndarray:
    values = rows[metric.column].to_numpy(float)
    if metric.iqr:  # a far upper quartile would squash every median near zero on a linear axis
        values = np.concatenate([values, rows.latency_q1_ms.to_numpy(float), rows.latency_q3_ms.to_numpy(float)])
    return values


def _wants_log(rows: pd.DataFrame, metric: Metric) -> bool:
    return metric.log_y == "always" or (metric.log_y == "auto" and _spans_decades(_y_values(rows, metric)))


def _style_y(ax: Axes, rows: pd.DataFrame, metric: Metric, log: bool) -> None:
    if log:  # spanning at least a decade: a narrower log axis gets no major tick and unreadable minor labels
        ax.set_yscale("log")
        values = _y_values(rows, metric)
        values = values[np.isfinite(values) & (values > 0)]
        if len(values) and values.max() / values.min() < 10:
            centre = float(np.sqrt(values.max() * values.min()))
            ax.set_ylim(min(values.min() / 1.5, centre / 3.2), max(values.max() * 1.5, centre * 3.2))
    ax.set_ylabel(metric.ylabel)
    ax.grid(True, which="major", alpha=0.3)


def _series_pages(run: Run, metric: Metric, groups: list[tuple[tuple, pd.DataFrame]]) -> list[tuple[str, Figure]]:
    """Pages of panels: rows = shape groups, columns = phases, one line per backend."""
    phases = [p for p in metric.phases if any((g.phase == p).any() for _, g in groups)]
    pages = [groups[i:i + GROUPS_PER_PAGE] for i in range(0, len(groups), GROUPS_PER_PAGE)]
    out = []
    for number, page in enumerate(pages, 1):
        fig = new_figure(4.3 * len(phases) + 1.6, 3.1 * len(page) + 0.8)
        axes = fig.subplots(len(page), len(phases), squeeze=False)
        drawn = pd.concat([g for _, g in page])
        for (key, group), row_axes in zip(page, axes):
            for phase, ax in zip(phases, row_axes):
                rows = group[group.phase == phase]
                if rows.empty:
                    ax.set_axis_off()
                    ax.text(0.5, 0.5, f"no {phase} data", ha="center", va="center", color="grey",
                            transform=ax.transAxes)
                    continue
                log = _wants_log(rows, metric)
                _draw(ax, rows, metric, log, along_seq=True, among=run.backends)
                _set_seq_axis(ax, rows.seq_k.to_numpy(float), metric.log_x)
                _style_y(ax, rows, metric, log)
                ax.set_title(f"{group_label(key)} · {phase}", fontsize=9)
                if metric.decorate:
                    metric.decorate(ax, rows, run)
        _legend(fig, drawn, metric, run.backends)
        suffix = f" (page {number} of {len(pages)})" if len(pages) > 1 else ""
        fig.suptitle(metric.title + suffix, fontsize=12)
        out.append((metric.name + (f"-{number}" if len(pages) > 1 else ""), fig))
    return out


def _case_pages(run: Run, metric: Metric, rows: pd.DataFrame) -> list[tuple[str, Figure]]:
    """Cases without a length series, side by side: one column of markers per case, one panel per phase."""
    order = rows.sort_values(["suite", "dtype", "mask_kind", "modifier_kind", "head_dim", "heads", "kv_heads", "seq_q",
                              "seq_k"])
    cases = list(dict.fromkeys(order.case_id))
    pages = [cases[i:i + CASES_PER_PAGE] for i in range(0, len(cases), CASES_PER_PAGE)]
    phases = [p for p in metric.phases if (rows.phase == p).any()]
    out = []
    for number, page in enumerate(pages, 1):
        position = {case: i for i, case in enumerate(page)}
        shown = rows[rows.case_id.isin(position)].assign(xpos=lambda d: d.case_id.map(position).astype(float))
        fig = new_figure(max(9.5, 0.32 * len(page) + 3.5), 2.4 * len(phases) + 2.0)
        axes = fig.subplots(len(phases), 1, squeeze=False, sharex=True)[:, 0]
        labels = shown.drop_duplicates("case_id").set_index("case_id").apply(case_label, axis=1)
        for phase, ax in zip(phases, axes):
            panel = shown[shown.phase == phase]
            log = _wants_log(panel, metric)
            _draw(ax, panel, metric, log, along_seq=False, among=run.backends)
            _style_y(ax, panel, metric, log)
            ax.set_xlim(-0.6, len(page) - 0.4)
            ax.set_xticks(range(len(page)), [labels[c] for c in page], rotation=60, ha="right", fontsize=7)
            ax.tick_params(axis="x", labelbottom=ax is axes[-1])  # shared x: case names once, at the bottom
            ax.set_title(f"{phase} · cases measured at one length only", fontsize=9)
            _family_separators(ax, shown.drop_duplicates("case_id").sort_values("xpos"))
            if metric.case_decorate:
                metric.case_decorate(ax, panel, run)
        _legend(fig, shown, metric, run.backends)
        suffix = f" (page {number} of {len(pages)})" if len(pages) > 1 else ""
        fig.suptitle(f"{metric.case_title or metric.title}: per case{suffix}", fontsize=12)
        out.append((f"{metric.name}-cases" + (f"-{number}" if len(pages) > 1 else ""), fig))
    return out


def _family_separators(ax: Axes, cases: pd.DataFrame) -> None:
    """Faint lines between suite / dtype / mask families, so a long row of cases reads as blocks."""
    family = (cases.suite + "|" + cases.dtype.astype(str) + "|" + cases.mask_kind.astype(str) + "|"
              + cases.modifier_kind.astype(str)).to_numpy()
    for i in np.flatnonzero(family[1:] != family[:-1]):
        ax.axvline(cases.xpos.iloc[i] + 0.5, color="grey", lw=0.6, alpha=0.5, label="_separator")


def _legend(fig: Figure, rows: pd.DataFrame, metric: Metric, among: list[str]) -> None:
    """One legend per figure: the backends drawn in it, and the overlay markers that occur."""
    handles = [Line2D([], [], color=(style := backend_style(b, among))[0], marker=style[1], label=backend_label(b))
               for b in dict.fromkeys(rows.backend)]
    values = rows[metric.column].to_numpy(float)
    marks = [(metric.timing_flags and rows.noisy_matters.any(),
              dict(marker="o", ms=11, mfc="none", mec="black",
                   label="noisy (IQR or rounds > 10% of median),\nquartiles overlap another's")),
             (np.isinf(values).any(), dict(marker="$\\infty$", ms=11, color="red", label="infinite (top edge)")),
             ((values == 0).any(),
              dict(marker="$0$", ms=8, color="black", label="0 on a log axis (bottom edge)")),
             (metric.timing_flags and rows.suspicious.any(),
              dict(marker="x", ms=10, mew=2, color="red", label="suspicious (above peak)"))]
    handles += [Line2D([], [], ls="", **style) for shown, style in marks if shown]
    fig.legend(handles=handles, loc="outside right center", fontsize=9, title="backend", title_fontsize=9)


def reference_line(ax: Axes, y: float, text: str, label: str, colour: str = "black", lw: float = 1.0,
           text_colour: str | None = None) -> None:
    """A dashed horizontal reference line at `y`, named at the left edge just above it."""
    ax.axhline(y, color=colour, ls="--", lw=lw, label=label)
    ax.text(0.01, y, text, transform=ax.get_yaxis_transform(), va="bottom", fontsize=8, color=text_colour)


def _speedup_decoration(ax: Axes, rows: pd.DataFrame, run: Run) -> None:
    reference_line(ax, 1.0, f"{run.baseline} = 1×", "_baseline", backend_color(run.baseline), 1.2, "dimgrey")
    # every label as '2×', minor ones too: matplotlib labels some minor ticks of an axis spanning about a decade
    # in its own style ('2 × 10^0'), which read as another unit next to panels whose ticks say '2×'
    ax.yaxis.set_major_formatter(_Times())
    ax.yaxis.set_minor_formatter(_Times(labelOnlyBase=False))


class _Times(LogFormatterSciNotation):
    """A log axis's labels as '2×': matplotlib decides which ticks get a label, this only writes it."""

    def __call__(self, x, pos=None):
        return f"{x:g}×" if super().__call__(x, pos) else ""


def _memory_decoration(ax: Axes, rows: pd.DataFrame, run: Run) -> None:
    """Dotted guides of slope 1 and 2 from below the smallest point: which backend is O(n), which O(n²)."""
    xs = np.unique(rows.seq_k.to_numpy(float))
    if len(xs) < 2:
        return
    x0 = xs.min()
    y0 = rows.loc[rows.seq_k == x0, "peak_mem"].min() / 2  # below the data, so no series hides a guide
    limits = ax.get_ylim()
    for power, label in ((1, "∝ n"), (2, "∝ n²")):
        ys = y0 * (xs / x0) ** power
        ax.plot(xs, ys, ls=":", color="black", lw=1, alpha=0.6, label=f"_guide {label}")
        last = int(np.flatnonzero(ys <= limits[1])[-1])  # label the guide where it is still in view
        ax.annotate(label, (xs[last], ys[last]), fontsize=8, color="black", alpha=0.7, xytext=(3, 0),
                    textcoords="offset points", va="center")
    # guides are a reference: they may extend the axis down to their start, never up past the data
    ax.set_ylim(min(limits[0], y0 / 1.3), limits[1])


def _tflops_decoration(ax: Axes, rows: pd.DataFrame, run: Run) -> None:
    """The measured matmul peak as a line, and % of it on the right axis."""
    dtype = str(rows.dtype.iloc[0])
    peak = peak_tflops(run.env, dtype)
    if peak is None:  # no env peak: recover it from the stored pct_of_peak when that was written
        ratio = (100 * rows.tflops / rows.pct_of_peak).dropna()
        peak = float(ratio.median()) if len(ratio) else None
    if not peak:
        return
    reference_line(ax, peak, f"measured {dtype} matmul peak {peak:.3g}", "_peak")
    top = max(peak, float(rows.tflops[np.isfinite(rows.tflops)].max()))
    ax.set_ylim(top=top * (3 if ax.get_yscale() == "log" else 1.15))
    sec = ax.secondary_yaxis("right", functions=(lambda t: 100 * t / peak, lambda p: p * peak / 100))
    sec.set_ylabel("% of measured peak")


def _tflops_case_decoration(ax: Axes, rows: pd.DataFrame, run: Run) -> None:
    """Cases of several dtypes share the panel: each dtype's measured peak spans its own cases, and one line of text
    names them all (a label per line overlapped where two dtypes' peaks and cases lie close: issue 67 item 8)."""
    named = []
    for dtype, g in rows.groupby("dtype"):
        peak = peak_tflops(run.env, str(dtype))
        if peak:
            ax.hlines(peak, g.xpos.min() - 0.45, g.xpos.max() + 0.45, color="black", ls="--", lw=1, label="_peak")
            named.append(f"{dtype} {peak:.3g}")
    if named:
        ax.text(0.99, 0.98, "dashed, each over its dtype's cases: measured matmul peak (TFLOP/s) " + ", ".join(named),
                transform=ax.transAxes, ha="right", va="top", fontsize=8)
    top = max([peak_tflops(run.env, str(d)) or 0 for d in set(rows.dtype)]
              + [float(rows.tflops[np.isfinite(rows.tflops)].max())])
    ax.set_ylim(top=top * (3 if ax.get_yscale() == "log" else 1.15))


def _ratio_decoration(ax: Axes, rows: pd.DataFrame, run: Run) -> None:
    reference_line(ax, 1.0, "tolerance: fails above", "_tolerance", "red", 1.2, "red")
    lo, hi = ax.get_ylim()
    if ax.get_yscale() == "log":
        ax.set_ylim(min(lo, 0.5), max(hi, 2.0))  # keep the tolerance line in view
    else:
        ax.set_ylim(0, max(hi, 1.1))


METRICS = {
    "latency": Metric("latency", "Latency (median; bars: 25th-75th percentile of the raw samples)", "latency_ms",
                      "latency (ms)", iqr=True),
    "speedup": Metric("speedup", "Speedup over {baseline} (higher is faster)", "speedup", "speedup",
                      skip_baseline=True, decorate=_speedup_decoration, case_decorate=_speedup_decoration),
    "memory": Metric("memory", "Peak memory above the inputs (log-log; dotted: ∝ n and ∝ n²)", "peak_mem",
                     "peak memory ({unit})", log_y="always", log_x="always", decorate=_memory_decoration,
                     timing_flags=False, case_title="Peak memory above the inputs (log scale)"),
    "tflops": Metric("tflops", "Throughput: TFLOP/s and % of the measured matmul peak", "tflops", "TFLOP/s",
                     decorate=_tflops_decoration, case_decorate=_tflops_case_decoration,
                     case_title="Throughput: TFLOP/s (dashed: each dtype's measured matmul peak)"),
    "err_ratio": Metric("err_ratio", "Error / tolerance (max over out, dq, dk, dv; > 1 fails)", "err_ratio",
                        "error / tolerance", decorate=_ratio_decoration, case_decorate=_ratio_decoration,
                        timing_flags=False, phases=VERDICT_PHASES),
}


def memory_figures(run: Run) -> list[tuple[str, Figure]]:
    """Peak memory in the unit that suits the run's largest value (KiB on a small CPU run, GiB on a big GPU one)."""
    largest = float(run.df.peak_mem_bytes.max()) if np.isfinite(run.df.peak_mem_bytes).any() else 0.0
    unit, size = next((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("bytes", 1))
                      if largest >= s or s == 1)
    scaled = replace(run, df=run.df.assign(peak_mem=run.df.peak_mem_bytes / size))
    metric = METRICS["memory"]
    return metric_figures(scaled, replace(metric, ylabel=metric.ylabel.format(unit=unit)))

