"""The roofline figure (TFLOP/s against FLOP/byte under both measured ceilings) and bandwidth over the decode sweep."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from matplotlib.figure import Figure

from harness.report.data import Run, peak_tflops
from harness.report.plots.metrics import Metric, reference_line, metric_figures
from harness.report.plots.style import backend_label, backend_style, new_figure
from harness.store.schema import FWD

#: a decode step (1 query) or a speculative-decoding verification (2-8 queries) over a KV cache
DECODE_MAX_QUERIES = 8


def bandwidth_peak(env: dict) -> float | None:
    """The run's measured copy bandwidth (GB/s, read + write) from env.json, or None."""
    value = env.get("copy_bandwidth_gbps")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def roofline_figures(run: Run) -> list[tuple[str, Figure]]:
    """One log-log panel per dtype: every timed row at (FLOP/byte, TFLOP/s) under the flat matmul peak and the
    slanted copy bandwidth (bandwidth x intensity)."""
    df = run.cases
    df = df[df.tflops.notna() & df.bytes_moved.notna() & (df.bytes_moved > 0) & (df.tflops > 0)]
    if df.empty:
        return []
    bw = bandwidth_peak(run.env)
    dtypes = sorted(set(df.dtype.astype(str)))
    fig = new_figure(5.5 * len(dtypes), 5.0)
    axes = fig.subplots(1, len(dtypes), squeeze=False)[0]
    for ax, dtype in zip(axes, dtypes):
        rows = df[df.dtype.astype(str) == dtype]
        intensity = rows.flops / rows.bytes_moved
        for backend, g in rows.groupby("backend"):
            ax.scatter(g.flops / g.bytes_moved, g.tflops, s=18, color=(style := backend_style(str(backend), run.backends))[0], marker=style[1],
                       label=backend_label(str(backend)))
        peak = peak_tflops(run.env, dtype)
        ridge = peak * 1e12 / (bw * 1e9) if bw and peak else None
        span = [intensity.min(), intensity.max()] + ([ridge] if ridge else [])  # both roof segments in view
        xs = np.logspace(np.log10(max(min(span) / 3, 1e-6)), np.log10(max(span) * 3), 100)
        if bw:
            roof = bw * 1e9 * xs / 1e12
            ax.plot(xs, np.minimum(roof, peak) if peak else roof, color="black", ls="--", lw=1,
                    label=f"roofline (copy {bw:.4g} GB/s" + (f", {dtype} matmul {peak:.3g} TFLOP/s)" if peak else ")"))
        elif peak:
            ax.axhline(peak, color="black", ls="--", lw=1, label=f"{dtype} matmul peak {peak:.3g} TFLOP/s")
        if ridge:
            ax.axvline(ridge, color="grey", ls=":", lw=1, label=f"ridge point {ridge:.3g} FLOP/byte")
        ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte moved)", ylabel="TFLOP/s",
               title=dtype)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)  # below: points stay visible
    fig.suptitle("Roofline: achieved TFLOP/s under the measured matmul and bandwidth ceilings")
    return [("roofline", fig)]


def _bandwidth_decoration(ax, rows, run: Run) -> None:
    bw = bandwidth_peak(run.env)
    if bw:
        reference_line(ax, bw, f"measured copy bandwidth {bw:.4g} GB/s", "_peak")


BANDWIDTH = Metric("bandwidth", "Decode and verification: GB/s moved against the measured copy bandwidth", "gbps",
                   "GB/s", decorate=_bandwidth_decoration, case_decorate=_bandwidth_decoration, phases=(FWD,))


def bandwidth_figures(run: Run) -> list[tuple[str, Figure]]:
    """GB/s of the decode sweep (cases with at most DECODE_MAX_QUERIES queries over a longer cache) per backend."""
    decode = run.df[(run.df.seq_q <= DECODE_MAX_QUERIES) & (run.df.seq_k > run.df.seq_q)]
    return metric_figures(replace(run, df=decode), BANDWIDTH)
