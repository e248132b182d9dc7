"""The run report: environment, headline per backend, winners, every figure and the semantics table (MD + HTML)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.backends.registry import versioned_backends
from harness.history.changes import detect_changes, key_series, plot_trend, trend_file
from harness.history.index import CHANGE_COLUMNS, open_index
from harness.extras import MissingExtra
from harness.measure.stats import MIN_SEGMENT, change_points
from harness.report.plots import plot_run
from harness.report.analysis import (answered, failures, headline, modifier_support, not_run, semantics_table,
                                     short_cell, support_counts, unavailable_everywhere, winners)
from harness.report.data import Run, load_run, peak_tflops
from harness.report.render import Heading, Image, Para, Pre, Table, cell_text, slug, to_html, to_markdown
from harness.store.run_dir import ADVICE_JSON, ADVICE_TEXT, is_run_dir
from harness.store.run_state import benchmark_planned, incomplete, run_notes
from harness.store.schema import BASELINE, KEY, PHASES

FAILURE_LINKS = 5  # per backend in the headline; the rest are one click away in the failures section
#: a report draws at most this many trend figures (the largest steps first); `history --changes` draws all
MAX_TRENDS = 12

CAPTIONS = {
    "latency": "Median latency per backend and phase. Case families measured at several lengths are drawn "
               "against the key length (one panel per family); other cases side by side, one column each. "
               "Bars span the 25th-75th percentile of the raw samples; rings mark noisy timings.",
    "speedup": "Latency of the baseline divided by each backend's, on the same case and phase (above 1: faster "
               "than the baseline).",
    "memory": "Peak memory allocated above the inputs, log-log: a backend parallel to the ∝ n² guide "
              "materializes the score matrix, one parallel to ∝ n does not.",
    "tflops": "Achieved TFLOP/s (attended pairs only) against the dense-matmul peak measured on this device at "
              "the start of the run (dashed; right axis: % of it); red crosses are faster than that peak and "
              "not to be trusted.",
    "err_ratio": "Worst error over out, dq, dk, dv divided by its tolerance: how close each backend is to failing "
                 "(above 1: failed). An infinite ratio (NaN/inf output) sits on the top edge, an exact 0 on the "
                 "bottom edge of a log axis.",
    "support": "Which backend ran, passed or failed on which case groups (counts of case × phase verdicts).",
    "semantics": "How each backend behaves where conventions differ (orange: differs from the others).",
    "roofline": "Every timed row at its arithmetic intensity (FLOP per least byte moved) and achieved TFLOP/s, under "
                "the two ceilings measured at the start of the run: the copy bandwidth (slanted) and the matmul "
                "peak (flat). Left of the ridge point a kernel is memory-bound and judged by its GB/s.",
    "bandwidth": "Decode and verification (at most 8 queries over a cache): GB/s of the least traffic (Q, visible "
                 "K/V once per kv head, O) against the measured copy bandwidth (dashed).",
}
TITLES = {"latency": "Latency", "speedup": "Speedup", "memory": "Peak memory", "tflops": "Throughput",
          "err_ratio": "Error-to-tolerance ratio", "support": "Support and correctness matrix",
          "semantics": "Semantics", "roofline": "Roofline", "bandwidth": "Decode bandwidth"}


def environment_table(run: Run) -> pd.DataFrame:
    """Where and with what the run happened, as (item, value) rows."""
    env, df = run.env, run.df
    timing = env.get("timing_mode") or ", ".join(sorted(df.timing_mode.dropna().astype(str).unique())) or None
    peaks = {d: peak_tflops(env, d) for d in sorted(run.cases.dtype.dropna().astype(str).unique())}
    items = {
        "run": env.get("run_id") or run.run_dir.name,
        "run status": f"INCOMPLETE: {incomplete(env)}" if incomplete(env) else env.get("status"),
        "refused lines": "; ".join(f"{file}: {n}" for file, n in run.refused.items()) or None,
        "device": f"{env.get('device_name', '?')} ({env.get('device_type', '?')})",
        "cpu": env.get("cpu_model"), "threads": env.get("threads"),
        "compute capability": env.get("compute_capability"), "driver": env.get("driver"),
        "torch": env.get("torch"), "cuda": env.get("cuda"), "cudnn": env.get("cudnn"), "triton": env.get("triton"),
        **{backend.label or backend.name: env.get(key) for key, backend in versioned_backends().items()},
        "python": env.get("python"),
        "git": f"{str(env.get('git_sha', '?'))[:12]}{' (dirty)' if env.get('git_dirty') else ''}",
        "started": env.get("started"), "testbed": env.get("testbed_id"),
        "timing mode": timing or "— (correctness-only run)",
        "measured matmul peak": ", ".join(f"{d} {p:.3g} TFLOP/s" for d, p in peaks.items() if p) or "—",
        "measured copy bandwidth": (f"{env['copy_bandwidth_gbps']:.4g} GB/s" if env.get("copy_bandwidth_gbps")
                                    else "—"),
        "timing fidelity": "; ".join(f"{r.case_id.split(':', 1)[1]} {r.backend}: {r.observed}"
                                     for r in run.fidelity.itertuples()) or None,
    }
    return pd.DataFrame([(k, v) for k, v in items.items() if v not in (None, "")], columns=["item", "value"])


def report_blocks(run: Run, figures: dict[str, list[Path]], history: list | None = None) -> list:
    """The report as a list of blocks: what to say, independent of the format."""
    fails = failures(run)
    sections = [("Environment", [Table(environment_table(run))]),
                ("Headline per backend", _headline_section(run, fails))]
    if run.has_perf:
        sections.append(("Winner per shape group", _winners_section(run)))
    sections += [("Figures", _figures_section(figures, run)), ("Semantics", _semantics_section(run, figures)),
                 (f"Failures ({len(fails)})", [Table(fails, [slug(r.backend, r.case_id, r.phase)
                                                             for r in fails.itertuples()])] if len(fails) else
                  [Para("None: every verdict that ran passed.")])]
    modifiers = modifier_support(run)
    if not modifiers.empty:  # the report split by modifier: which backend runs which, and how it got there
        sections.insert(2, ("Modifiers", [Table(modifiers)]))
    if run.env.get("fuzz"):
        sections.insert(1, ("Fuzz", _fuzz_section(run.env["fuzz"])))
    advice = run.run_dir / ADVICE_TEXT
    if advice.is_file():  # a `recommend` run: what it advised, as it printed it (advice.json has it as data)
        sections.insert(1, ("Advisor", [Para(f"What `recommend` advised from this run's measurements "
                                             f"({ADVICE_JSON} holds the same as data):"), Pre(advice.read_text())]))
    skipped = not_run(run)
    if not skipped.empty:
        sections.append(("Not run, and why", [Table(skipped)]))
    if history is not None:
        sections.append(("History on this testbed", history))
    anchors = [slug(name.split(" (")[0]) for name, _ in sections]
    blocks: list = [Heading(1, f"Attention harness run {run.env.get('run_id') or run.run_dir.name}"),
                    Para(_summary(run)),
                    Para(" · ".join(f"[{name}](#{a})" for (name, _), a in zip(sections, anchors)))]
    for (name, body), anchor in zip(sections, anchors):
        blocks += [Heading(2, name, anchor), *body]
    return blocks


def history_section(run_dir: Path, env: dict, out_dir: Path) -> list | None:
    """Change points, over the runs stored beside `run_dir` on its testbed up to it, of the keys this run holds, with
    a trend figure per changed key under out_dir/figures/trends/; None without a testbed or a folder of runs."""
    testbed, root = env.get("testbed_id"), run_dir.parent
    if not testbed or not root.is_dir() or is_run_dir(root):
        return None
    try:
        history = open_index(root).rows(CHANGE_COLUMNS, testbed=str(testbed))
    except MissingExtra as exc:  # the run's report stands without it
        return [Para(f"No history section: {exc}.")]
    if history.empty:
        return None
    started = env.get("started")
    if started and "started" in history:  # a report rebuilt later must not show the future of its run
        history = history[history.started.astype(str) <= str(started)]
    runs = history.run_id.nunique()
    where = f"{runs} stored run(s) of testbed {testbed} up to this one"
    if runs < 2 * MIN_SEGMENT:  # two segments of MIN_SEGMENT runs
        return [Para(f"{where}; change points need at least {2 * MIN_SEGMENT}. `python -m harness history --changes` "
                     "finds them once there are more.")]
    # this run's keys alone: the others' change points are never shown here (history --changes has them)
    history = history.merge(history[history.run_dir == str(run_dir)][list(KEY)].drop_duplicates(), on=list(KEY))
    c = detect_changes(history, testbed=str(testbed))
    c = c.loc[c.ratio.astype(float).map(lambda r: max(r, 1 / r)).sort_values(ascending=False).index]
    if c.empty:
        return [Para(f"{where}: no key of this run changed level (change points: ruptures PELT over each key's "
                     "run medians; `python -m harness history --changes --all-trends` draws every key).")]
    series, figures = key_series(history), []
    for r in c.head(MAX_TRENDS).itertuples():
        key = (r.testbed_id, *(getattr(r, k) for k in KEY))
        figures.append(plot_trend(series[key], change_points(series[key].latency_ms.to_numpy()),
                                  f"{r.backend} {r.case_id} [{r.phase}]",
                                  out_dir / "figures" / "trends" / f"{trend_file(key)}.png"))
    table = pd.DataFrame({"backend": c.backend, "case": c.case_id, "phase": c.phase,
                          "before (ms)": c.before_ms.map("{:.4g}".format),
                          "after (ms)": c.after_ms.map("{:.4g}".format),
                          "ratio": c.ratio.map("{:.2f}x".format),
                          "between runs": c.run_id_before.astype(str) + " → " + c.run_id_after.astype(str),
                          "git": c.git_sha_before.astype(str).str[:8] + " → " + c.git_sha_after.astype(str).str[:8]})
    blocks = [Para(f"{where}: {len(c)} change point(s) in this run's keys, largest step first. Each figure is a "
                   "key's median latency per run (oldest left), its segments' medians in gray and the change "
                   "points dashed red."), Table(table.reset_index(drop=True))]
    blocks += [Image(p, f"trend: {p.stem}") for p in figures]
    if len(c) > len(figures):
        blocks.append(Para(f"{len(c) - len(figures)} more change point(s) not drawn here: "
                           "`python -m harness history --changes` draws them all."))
    return blocks


def _summary(run: Run) -> str:
    filters = ", ".join(f"{k} = {v}" for k, v in run.filters.items())
    # a benchmark run stopped before its timings is not a correctness-only run
    unmeasured = "Benchmark run without timings" if benchmark_planned(run.env) else "Correctness-only run"
    kind = ("Benchmark run: latency, memory and throughput included." if run.has_perf
            else f"{unmeasured}: no latency columns, so no performance figures.")
    notes = "".join(f" {note[0].upper()}{note[1:]}." for note in run_notes(run.env, run.refused))
    return (f"{run.cases.case_id.nunique()} cases × {len(run.backends)} backends on "
            f"{run.env.get('device_name', 'an unrecorded device')}, built from the stored results only"
            + (f" (filtered: {filters})" if filters else "") + ". " + kind + notes)


def _fuzz_section(fuzz: dict) -> list:
    """`check --fuzz`: the seed, budget and cases drawn, then each distinct failure at its smallest, with its command."""
    from harness.fuzzing.fuzz import run_line  # the terminal's words; torch loads only for a fuzz run's report
    text = (f"Seed {fuzz['seed']}: {run_line(fuzz)}. {len(fuzz['failures'])} distinct failures, each shrunk to the "
            "smallest case that fails the same check; drawn cases: how many of the drawn cases shrank onto it.")
    if fuzz.get("unshrunk"):
        text += f" {fuzz['unshrunk']} failing drawn cases were left unshrunk by the bound (their rows are below)."
    if not fuzz["failures"]:
        return [Para(text)]
    table = pd.DataFrame([{"backend": f["backend"], "check": f["check"], "smallest case": f["case"],
                           "drawn cases": f["drawn_cases"], "steps": "; ".join(f["steps"]) or "(drawn as is)",
                           "repro": f["repro"]} for f in fuzz["failures"]])
    return [Para(text), Table(table)]


def _headline_section(run: Run, fails: pd.DataFrame) -> list:
    head = headline(run)
    if head.empty:
        return [Para("No attention cases in this run.")]
    links = []
    for backend in head.backend:
        mine = fails[fails.backend == backend]
        shown = [f"[{r.case_id} {r.phase}](#{slug(r.backend, r.case_id, r.phase)})"
                 for r in mine.head(FAILURE_LINKS).itertuples()]
        if len(mine) > FAILURE_LINKS:
            shown.append(f"[+{len(mine) - FAILURE_LINKS} more](#failures)")
        links.append(", ".join(shown))
    head.insert(head.columns.get_loc("not run") + 1, "failed rows", links)
    head = head.rename(columns=lambda c: c.replace("speedup", f"speedup vs {run.baseline}")
                       .replace("baseline", run.baseline))
    legend = ("cases: the matrix's cases, each counted once under its worst phase, as the run's summary counts "
              "them; passed: every verdict that ran passed (partly run: some phase was unsupported or unavailable); "
              "failed: any fail, error or oom; not run: unsupported or unavailable (reasons below)")
    if "probe cases" in head.columns:
        legend += ("; probe cases: the probes' own cases (edge:, ...: empty, non-contiguous, extreme inputs), "
                   "counted apart, and how many of them failed (listed under Failures)")
    if run.has_perf:
        legend += (f"; speedups and memory are medians over cases relative to {run.baseline}; wins: shape groups "
                   "where the backend was the fastest correct one")
    return [Para(legend + "."), Table(head)]


def _winners_section(run: Run) -> list:
    """One row per shape, one column per phase: 'winner latency (next: runner-up ×margin)'."""
    table = winners(run)
    if not table.empty:
        def cell(r) -> str:
            flags = " (noisy)" if r.noisy else ""  # a suspicious figure wins nothing (analysis.winners)
            text = f"{r.winner}{flags} {cell_text(r.latency_ms)} ms"
            return text + (f" (next: {r.runner_up} ×{r.margin:.2f})" if r.runner_up else " (only one)")
        shape = ["dtype", "head_dim", "mask", "modifier_kind", "batch", "heads", "kv_heads", "seq_q", "seq_k"]
        table = table.assign(cell=[cell(r) for r in table.itertuples()]).pivot_table(
            index=shape, columns="phase", values="cell", aggfunc="first", sort=False)
        table = table.reindex(columns=[p for p in PHASES if p in table.columns]).reset_index().rename_axis(
            columns=None).rename(columns={p: f"{p} winner" for p in PHASES})
        if (table.kv_heads == table.heads).all():
            table = table.drop(columns=["kv_heads"])
    blocks = [Para("Fastest backend whose verdicts passed for that phase (fwd+bwd needs both); 'next' is the "
                   "runner-up and how many times slower it was."), Table(table)]
    if not run.has_baseline:
        blocks.append(Para(f"Baseline {run.baseline!r} has no timings in this run: no speedups."))
    return blocks


def _figures_section(figures: dict[str, list[Path]], run: Run) -> list:
    blocks: list = []
    for kind, paths in figures.items():
        if kind != "semantics" and paths:
            caption = CAPTIONS.get(kind, "")
            gone = unavailable_everywhere(support_counts(run)) if kind == "support" else []
            if gone:
                caption += (f" Not shown: {', '.join(gone)}, unavailable on every case here (why: 'Not run, and "
                            "why').")
            blocks += [Heading(3, TITLES.get(kind, kind)), Para(caption)]
            blocks += [Image(p, f"{TITLES.get(kind, kind)}: {p.stem}") for p in paths]
    missing = [TITLES.get(k, k) for k, p in figures.items() if not p and k != "semantics"]
    if missing:
        blocks.append(Para("Not drawn (no data in this run): " + ", ".join(missing) + "."))
    return blocks


def _semantics_section(run: Run, figures: dict[str, list[Path]]) -> list:
    table = semantics_table(run)
    if table.empty:
        return [Para("No semantics observations in this run.")]
    has_answer = table.apply(lambda row: any(answered(v) for v in row), axis=1)
    blocks = [Para(CAPTIONS["semantics"] + " A backend that could not take a question shows its status; the "
                   "reasons are under 'Not run, and why'."), Table(table[has_answer].map(short_cell).reset_index())]
    if not has_answer.all():
        blocks.append(Para("No backend could answer on this device: " + ", ".join(table.index[~has_answer]) + "."))
    return blocks + [Image(p, "semantics table") for p in figures.get("semantics", [])]


def build_report(run_dir: str | Path, baseline: str = BASELINE, out_dir: str | Path | None = None, *,
                 backends: list[str] | None = None, dtype: str | None = None, mask: str | None = None,
                 strict_baseline: bool = False) -> Path:
    """Render every figure and the report of a stored run from its files only (nothing is re-run); returns the
    path of report.html (report.md beside it). Figures go to <out_dir>/figures/."""
    run = load_run(run_dir, baseline=baseline, backends=backends, dtype=dtype, mask=mask,
                   strict_baseline=strict_baseline)
    out = Path(out_dir) if out_dir else run.run_dir
    out.mkdir(parents=True, exist_ok=True)
    figures = plot_run(run, out)
    # the history is of latencies: a run without timings has none to add (nor trend figures to draw)
    blocks = report_blocks(run, figures, history_section(run.run_dir, run.env, out) if run.has_perf else None)
    (out / "report.md").write_text(to_markdown(blocks, out))
    path = out / "report.html"
    path.write_text(to_html(blocks, blocks[0].text))
    return path
