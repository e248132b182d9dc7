"""Figures from a small synthetic run: valid PNGs, one line per backend per panel, consistent colours, degradation."""

import re
from dataclasses import replace

import pandas as pd
import pytest
from matplotlib.image import imread

from harness.report.plots import FIGURE_BUILDERS, METRICS, backend_color, backend_style, plot_run, save
from harness.report.plots import metric_rows
from harness.backends.appearance import PLUGIN_COLOURS, PLUGIN_MARKERS, contrast_on_white
from harness.backends.registry import BUILT_IN, all_backends
from harness.report.analysis import group_label, split_series, support_counts
from harness.report.data import load_run
from tests.fixtures.synthetic_run import write_run

BACKENDS = ("naive", "sdpa-flash", "flex", "xformers")
SMALL = dict(seqs=(128, 256, 512), dtypes=("fp32",), masks=("none", "causal"), decode=True)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return load_run(write_run(tmp_path_factory.mktemp("run"), backends=BACKENDS, **SMALL))


@pytest.fixture(scope="module")
def written(run):
    return plot_run(run)


@pytest.fixture(scope="module")
def figures(run):
    """{kind: [(name, Figure)]}, built once (rendering to PNG is the slow part, and is tested once)."""
    return {kind: build(run) for kind, build in FIGURE_BUILDERS.items()}


def _valid_png(path):
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 400, (path, image.shape)


def test_every_figure_is_written_as_a_valid_png(written):
    assert set(written) == set(FIGURE_BUILDERS)
    for kind, paths in written.items():
        assert paths, f"no {kind} figure"
        for path in paths:
            _valid_png(path)
            assert path.parent.name == "figures"


def _series(ax) -> list[str]:
    """Backends drawn on an axis: labelled lines (guides, reference lines and overlays are '_'-labelled)."""
    return sorted(line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_"))


@pytest.mark.parametrize("kind", ["latency", "speedup", "memory", "tflops", "err_ratio"])
def test_one_line_per_backend_in_each_panel(run, figures, kind):
    metric = METRICS[kind]
    if kind == "memory":  # plotted in a unit chosen per run; which rows have a value is decided by the bytes
        metric = replace(metric, column="peak_mem_bytes")
    series, singles = split_series(metric_rows(run, metric))
    expected = {f"{group_label(key)} · {phase}": sorted(set(g.backend[g.phase == phase]))
                for key, g in series for phase in set(g.phase)}
    expected |= {f"{phase} · cases measured at one length only": sorted(set(g.backend))
                 for phase, g in singles.groupby("phase")}
    panels = [ax for _, fig in figures[kind] for ax in fig.axes if ax.get_title()]
    assert {ax.get_title(): _series(ax) for ax in panels} == expected
    phases = 2 if kind == "err_ratio" else 3
    assert len(series) == 2 and len(panels) == 2 * phases + phases  # two length series, plus the decode case
    assert [name for name, _ in figures[kind]] == [kind, f"{kind}-cases"]


def test_panels_have_the_expected_series(figures):
    by_title = {ax.get_title(): ax for _, fig in figures["latency"] for ax in fig.axes}
    causal = [t for t in by_title if "causal" in t]
    # flex has no backward and xformers is unavailable: 3 lines forward, 2 backward
    assert [len(_series(by_title[t])) for t in sorted(causal)] == [2, 3, 2]
    speedup = {ax.get_title(): _series(ax) for _, fig in figures["speedup"] for ax in fig.axes}
    assert all("naive" not in s for s in speedup.values())  # the baseline is the y = 1 line, not a series


def test_a_backend_has_one_colour_everywhere(figures):
    seen = {}
    for kind in ("latency", "speedup", "memory", "tflops", "err_ratio"):
        for _, fig in figures[kind]:
            for ax in fig.axes:
                for line in ax.get_lines():
                    if not line.get_label().startswith("_"):
                        seen.setdefault(line.get_label(), set()).add(line.get_color())
    assert seen and all(colours == {backend_color(b)} for b, colours in seen.items())
    builtin = ["naive", "sdpa", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flex", "xformers",
               "flash-attn"]
    assert len({backend_color(b) for b in builtin}) == len(builtin)
    assert backend_style("my-attn") == backend_style("my-attn")  # plugins: stable, not per-process hash()


def test_plugins_never_wear_a_built_in_colour_or_marker():
    built_in = [b for b in all_backends().values() if type(b).__module__ in BUILT_IN]
    colours, markers = [b.colour for b in built_in], [b.marker for b in built_in]
    assert len(set(colours)) == len(colours) and len(set(markers)) == len(markers)  # built-ins: one each
    assert not set(PLUGIN_COLOURS) & set(colours) and not set(PLUGIN_MARKERS) & set(markers)
    plugins = [f"plugin-{i}" for i in range(len(PLUGIN_COLOURS))]
    styles = {p: backend_style(p, plugins) for p in plugins}
    assert len({colour for colour, _ in styles.values()}) == len(plugins)  # one run's plugins: a colour each
    assert styles == {p: backend_style(p, reversed(plugins)) for p in plugins}  # the same set: the same colours
    # issue 67: a plugin's default colour stands out on white (the pale mint one a user got was 1.18:1)
    assert min(map(contrast_on_white, PLUGIN_COLOURS)) >= 3.0 and contrast_on_white("#aaffc3") < 1.5


def test_a_plugin_beside_sdpa_and_naive_has_its_own_colour_in_the_report(tmp_path):
    """The report of a run with a plugin (undeclared colour) beside sdpa and naive: three colours, in every line
    of every metric figure and in the legends."""
    run = load_run(write_run(tmp_path, backends=("naive", "sdpa", "my-attn"), **SMALL))
    seen: dict[str, set] = {}
    for kind in ("latency", "speedup", "memory", "tflops", "err_ratio"):
        for _, fig in FIGURE_BUILDERS[kind](run):
            for ax in fig.axes:
                for line in ax.get_lines():
                    if not line.get_label().startswith("_"):
                        seen.setdefault(line.get_label(), set()).add(line.get_color())
            for legend in fig.legends:
                for handle, text in zip(legend.legend_handles, legend.get_texts()):
                    seen.setdefault(text.get_text(), set()).add(handle.get_color())
    assert {b: len(c) for b, c in seen.items()} == {"naive": 1, "sdpa": 1, "my-attn": 1}
    assert len({c for colours in seen.values() for c in colours}) == 3


def test_scales_and_guides(figures):
    memory = figures["memory"][0][1].axes
    panels = [ax for ax in memory if ax.get_title()]
    assert all(ax.get_xscale() == "log" and ax.get_yscale() == "log" for ax in panels)
    guides = [line.get_label() for line in panels[0].get_lines() if line.get_label().startswith("_guide")]
    assert guides == ["_guide ∝ n", "_guide ∝ n²"]
    ratio = figures["err_ratio"][0][1].axes
    # naive's error is ~100x below the others: the ratio axis is logarithmic and shows the tolerance line
    assert any(ax.get_yscale() == "log" for ax in ratio)
    assert all(any(line.get_label() == "_tolerance" for line in ax.get_lines()) for ax in ratio if ax.get_title())


def test_support_matrix_counts(figures):
    (_, fig), = figures["support"]
    texts = {t.get_text() for t in fig.axes[0].texts}
    # fp32 causal: 3 cases x 2 phases; the largest one has a planted sdpa-flash bwd failure and a flex fwd error
    assert "1 fail\n5 pass" in texts and "1 error\n2 pass\n3 unsup" in texts and "6 unavail" not in texts
    # xformers is unavailable on every case (a CPU run): left out, named in the title (issue 35)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [b for b in BACKENDS if b != "xformers"]
    assert "not shown, unavailable on every case here: xformers" in fig.axes[0].get_title()


def test_semantics_table_figure(figures):
    (_, fig), = figures["semantics"]
    cells = fig.axes[0].tables[0].get_celld()
    texts = {c.get_text().get_text() for c in cells.values()}
    assert {"nan", "0", "top-left"} <= texts  # an observed 'nan' is an answer, shown as such
    assert len({c.get_facecolor() for c in cells.values()}) > 1  # naive's differing answer is highlighted


def test_the_semantics_figure_is_readable_at_the_size_the_page_shows_it(tmp_path):
    """Issue 67 item 8: twelve backends made one 24-inch figure the page scaled to a third, its 7.5-pt text to ~3 pt.
    At most SEMANTICS_COLUMNS backends a figure, each no wider than the page shows at its own size (1,400 px at the
    figures' 110 dpi), its cells at SEMANTICS_FONT points; the highlighting still compares every backend."""
    from harness.report.plots.tables import SEMANTICS_COLUMNS, SEMANTICS_FONT

    names = ("naive", "sdpa-flash", "flex", "xformers", "b5", "b6", "b7")
    run = load_run(write_run(tmp_path, backends=names, seqs=(128,), dtypes=("fp32",), masks=("none",)))
    figs = FIGURE_BUILDERS["semantics"](run)
    assert [name for name, _ in figs] == ["semantics", "semantics-2"]
    for _, fig in figs:
        width, _ = fig.get_size_inches()
        assert width * fig.dpi <= 1400, width
        table = fig.axes[0].tables[0]
        assert len({c for (_, c) in table.get_celld() if c >= 0}) <= SEMANTICS_COLUMNS
        assert all(cell.get_text().get_fontsize() >= SEMANTICS_FONT for cell in table.get_celld().values())
    assert "(2 of 2)" in figs[1][1].axes[0].get_title()


def test_no_two_labels_of_a_throughput_figure_overlap(figures):
    """Issue 67 item 8: the per-case throughput figure named each dtype's peak at its line, where two dtypes' labels
    overlapped; its labels now never do - every text of every throughput axes, drawn, has its own box."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    for name, fig in figures["tflops"]:
        FigureCanvasAgg(fig).draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            boxes = [t.get_window_extent(renderer) for t in ax.texts if t.get_text() and t.get_visible()]
            for i, a in enumerate(boxes):
                for b in boxes[i + 1:]:
                    assert not a.overlaps(b), (name, [t.get_text() for t in ax.texts])
    assert any("measured matmul peak (TFLOP/s) " in t.get_text()
               for _, fig in figures["tflops"] for ax in fig.axes for t in ax.texts)


def test_correctness_only_run_skips_perf_figures(tmp_path):
    run = load_run(write_run(tmp_path, perf=False, seqs=(128, 256), dtypes=("fp32",), masks=("causal",)))
    written = plot_run(run)
    assert not any(written[k] for k in ("latency", "speedup", "memory", "tflops"))
    for kind in ("err_ratio", "support", "semantics"):
        assert written[kind], kind
        _valid_png(written[kind][0])


def test_single_backend_still_plots(tmp_path):
    run = load_run(write_run(tmp_path, backends=("sdpa-flash",), semantics=False, seqs=(128, 256), dtypes=("fp32",),
                             masks=("none",)))
    paths = save(FIGURE_BUILDERS["latency"](run), tmp_path)
    assert len(paths) == 1
    _valid_png(paths[0])
    panels = [ax for _, fig in FIGURE_BUILDERS["latency"](run) for ax in fig.axes if ax.get_title()]
    assert [_series(ax) for ax in panels] == [["sdpa-flash"]] * 3
    assert FIGURE_BUILDERS["speedup"](run) == [] and FIGURE_BUILDERS["semantics"](run) == []  # no baseline


def test_stale_figures_are_replaced(tmp_path):
    run_dir = write_run(tmp_path, backends=("naive",), seqs=(128,), dtypes=("fp32",), masks=("none",), perf=False)
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "latency-7.png").write_bytes(b"old")
    (tmp_path / "figures" / "mine.png").write_bytes(b"user file")
    plot_run(load_run(run_dir), tmp_path)
    assert not (tmp_path / "figures" / "latency-7.png").exists() and (tmp_path / "figures" / "mine.png").exists()


def test_values_a_log_axis_cannot_show_are_marked_at_its_edges(tmp_path):
    run_dir = write_run(tmp_path, backends=("naive", "sdpa-flash"), seqs=(128, 256), dtypes=("fp32",),
                        masks=("none",), perf=False, semantics=False)
    df = pd.read_csv(run_dir / "results.csv")
    fwd = df.phase == "fwd"
    df.loc[fwd & (df.backend == "sdpa-flash") & (df.seq_k == 128), ["status", "err_ratio"]] = ["fail", float("inf")]
    df.loc[fwd & (df.backend == "naive") & (df.seq_k == 256), "err_ratio"] = 0.0  # exact
    df.to_csv(run_dir / "results.csv", index=False)
    (_, fig), = FIGURE_BUILDERS["err_ratio"](load_run(run_dir))
    ax = next(ax for ax in fig.axes if ax.get_title().endswith("fwd"))
    assert ax.get_yscale() == "log"
    edges = {round(float(c.get_offsets()[0][1]), 2) for c in ax.collections if c.get_label() == "_edge"}
    assert edges == {0.96, 0.04}  # axes fractions: inf at the top edge, 0 at the bottom, neither dropped
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "infinite (top edge)" in legend and "0 on a log axis (bottom edge)" in legend


def test_rows_of_a_tagged_suite_stay_apart_from_the_matrix(tmp_path):
    run_dir = write_run(tmp_path, backends=("naive", "sdpa-flash"), seqs=(128, 256), dtypes=("fp32",),
                        masks=("none",), perf=False, semantics=False)
    df = pd.read_csv(run_dir / "results.csv")
    fwd = df[df.phase == "fwd"]
    probes = pd.concat([fwd.assign(case_id="edge:noncontig:" + fwd.case_id),  # same shapes as the matrix
                        fwd.assign(case_id="edge:empty:" + fwd.case_id, phase="fwd+bwd")])
    pd.concat([df, probes]).to_csv(run_dir / "results.csv", index=False)
    run = load_run(run_dir)
    table = support_counts(run)
    assert list(table.columns) == ["edge: fp32 · none", "fp32 · none"]
    assert table.at["naive", "edge: fp32 · none"] == {"pass": 4}  # a probe's fwd+bwd verdict counts too
    series, _ = split_series(metric_rows(run, METRICS["err_ratio"]))
    assert [key[0] for key, _ in series] == ["", "edge"]
    for _, g in series:  # one point per backend and length: the probes do not zigzag the matrix's lines
        assert (g.groupby(["backend", "phase"]).seq_k.nunique() == g.groupby(["backend", "phase"]).size()).all()


def test_every_speedup_tick_label_reads_as_a_multiple(figures):
    for _, fig in figures["speedup"]:
        fig.canvas.draw()  # tick labels are decided at draw time
        for ax in fig.axes:
            labels = [t.get_text() for t in ax.yaxis.get_ticklabels(which="both") if t.get_text()]
            assert labels and all(re.fullmatch(r"[0-9.e+-]+×", t) for t in labels), (ax.get_title(), labels)
    # an axis spanning under a decade, where matplotlib labels minor ticks in its own style ('2 × 10^0')
    import matplotlib.pyplot as plt
    from types import SimpleNamespace

    from harness.report.plots.metrics import _speedup_decoration

    fig, ax = plt.subplots()
    ax.set_yscale("log")
    ax.set_ylim(1.5, 4)
    _speedup_decoration(ax, None, SimpleNamespace(baseline="naive"))
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.yaxis.get_ticklabels(which="both") if t.get_text()]
    plt.close(fig)
    assert "2×" in labels and all(re.fullmatch(r"[0-9.]+×", t) for t in labels), labels


def test_the_noisy_ring_marks_only_an_order_the_samples_do_not_settle():
    """issue 67 item 8: a ring on almost every point said nothing. A noisy row is ringed only where its samples'
    quartiles overlap another backend's on the same case and phase (data.unsettled)."""
    import pandas as pd

    from harness.report.data import unsettled
    df = pd.DataFrame({"case_id": ["c1", "c1", "c2", "c2", "c3"], "phase": "fwd",
                       "backend": ["a", "b", "a", "b", "a"], "noisy": [True, False, True, True, True],
                       "latency_ms": [1.0, 1.1, 1.0, 5.0, 1.0], "latency_q1_ms": [0.8, 1.05, 0.9, 4.5, 0.5],
                       "latency_q3_ms": [1.2, 1.15, 1.1, 5.5, 2.0]})
    # c1: a's quartiles reach b's; c2: both noisy but far apart; c3: a alone
    assert unsettled(df).noisy_matters.tolist() == [True, False, False, False, False]
