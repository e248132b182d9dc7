"""Categorical figures: the support / correctness matrix and the semantics table."""

from __future__ import annotations

import textwrap

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from harness.report.plots.style import backend_color, new_figure
from harness.report.analysis import (answered, semantics_table, short_cell, support_counts,
                                     unavailable_everywhere)
from harness.report.data import Run
from harness.store.schema import ERROR, FAIL, OOM, PASS, UNAVAILABLE, UNSUPPORTED

# worst first: the colour of a cell is that of the worst status in it
_STATUS_COLOURS = {FAIL: "#d62728", ERROR: "#8b0000", OOM: "#ff7f0e", PASS: "#2ca02c",
                   UNSUPPORTED: "#c7c7c7", UNAVAILABLE: "#f0f0f0"}
_RANK = {status: i for i, status in enumerate(_STATUS_COLOURS)}
_SHORT = {UNSUPPORTED: "unsup", UNAVAILABLE: "unavail"}


def _cell_colour(counts: dict) -> str:
    if not counts:
        return "white"
    worst = next((status for status in (ERROR, FAIL, OOM, PASS, UNSUPPORTED) if counts.get(status)), UNAVAILABLE)
    # pass on some phases, not run on others (e.g. no backward): a lighter green says "partial"
    return "#98df8a" if worst == PASS and set(counts) - {PASS} else _STATUS_COLOURS[worst]


def support_figure(run: Run) -> list[tuple[str, Figure]]:
    """Backends x case groups; each cell: counts of (case, phase) verdict rows by status, coloured by the worst.
    Backends are columns when there are more case groups than backends (the figure grows downwards); a backend
    unavailable on every case is left out and named in the title (its column would be all grey)."""
    table = support_counts(run)
    gone = unavailable_everywhere(table)
    table = table.drop(index=gone)
    if table.empty:
        return []
    backends_across = table.shape[1] > table.shape[0]
    grid = table.T if backends_across else table
    n_rows, n_cols = grid.shape
    fig = new_figure(max(8.0, (1.1 if backends_across else 1.25) * n_cols + 3.0), 0.5 * n_rows + 2.4)
    ax = fig.add_subplot()
    for i, row_key in enumerate(grid.index):
        for j, col_key in enumerate(grid.columns):
            counts = grid.at[row_key, col_key]
            colour = _cell_colour(counts)
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=colour, edgecolor="white", lw=2))
            ranked = sorted(counts.items(), key=lambda c: _RANK.get(c[0], len(_RANK)))  # no colour: last
            text = "\n".join(f"{n} {_SHORT.get(s, s)}" for s, n in ranked)
            dark = colour in ("#d62728", "#8b0000", "#2ca02c")
            ax.text(j, i, text or "—", ha="center", va="center", fontsize=7.5, color="white" if dark else "black")
    ax.set(xlim=(-0.5, n_cols - 0.5), ylim=(n_rows - 0.5, -0.5))
    ax.set_xticks(range(n_cols), [str(c).replace(" · ", "\n") for c in grid.columns], fontsize=8)
    ax.set_yticks(range(n_rows), grid.index, fontsize=8.5)
    if backends_across:
        ax.xaxis.tick_top()
    axis = ax.xaxis if backends_across else ax.yaxis
    for tick, backend in zip(axis.get_major_ticks(), grid.columns if backends_across else grid.index):
        for label in (tick.label1, tick.label2):  # top ticks draw label2
            label.set_color(backend_color(str(backend), run.backends))
    ax.tick_params(length=0)
    groups = "case group (suite: dtype · mask family)"
    ax.set_ylabel(groups) if backends_across else ax.set_xlabel(groups)
    ax.set_title("Support and correctness: verdict rows per status ((case, phase) rows, fwd and bwd)"
                 + (f"\nnot shown, unavailable on every case here: {', '.join(gone)}" if gone else ""), fontsize=11)
    legend = [Patch(color=c, label=s) for s, c in _STATUS_COLOURS.items()]
    legend.insert(4, Patch(color="#98df8a", label="pass + not run"))
    fig.legend(handles=legend, loc="outside lower center", ncol=4, fontsize=8)
    return [("support", fig)]


#: backends a semantics figure shows side by side: wider, the page scales it down and its text becomes unreadable
#: (12 backends made a 24-inch figure shown ~1,300 px wide: 7.5-pt text at ~3 pt; issue 67 item 8)
SEMANTICS_COLUMNS = 5
#: the semantics figure's cell text (points), shown at its own size
SEMANTICS_FONT = 9.0


def semantics_figure(run: Run) -> list[tuple[str, Figure]]:
    """The observed behaviour per question x backend, SEMANTICS_COLUMNS backends a figure; a cell differing from its
    row's majority (over every backend) is highlighted."""
    table = semantics_table(run)
    if table.empty:
        return []
    # a question no backend could answer here (e.g. GPU-only probes on a CPU run) is a row of greys: the
    # report's table keeps it, the figure shows what was observed
    table = table[table.apply(lambda row: any(answered(v) for v in row), axis=1)]
    if table.empty:
        return []
    colours = [_row_colours(list(row)) for row in table.to_numpy()]  # the majority over every backend
    pages = range(0, table.shape[1], SEMANTICS_COLUMNS)
    out = []
    for page, start in enumerate(pages, 1):
        columns = slice(start, start + SEMANTICS_COLUMNS)
        part = table.iloc[:, columns]
        cells = [[textwrap.fill(short_cell(v), 18) or "—" for v in row] for row in part.to_numpy()]
        questions = [textwrap.fill(q, 30) for q in table.index]
        lines = [max(c.count("\n") for c in row + [q]) + 1 for row, q in zip(cells, questions)]
        fig = new_figure(3.0 + 1.7 * part.shape[1], 1.0 + 0.24 * sum(lines) + 0.14 * len(lines))
        ax = fig.add_subplot()
        ax.set_axis_off()
        tab = ax.table(cellText=cells, rowLabels=questions, colLabels=list(part.columns), loc="upper center",
                       cellColours=[row[columns] for row in colours], cellLoc="center")
        tab.auto_set_font_size(False)
        tab.set_fontsize(SEMANTICS_FONT)
        total = sum(lines) + 1.5
        for (r, c), cell in tab.get_celld().items():
            cell.set_height((lines[r - 1] if r > 0 else 1.5) / total)
            if r == 0 and c >= 0:
                cell.get_text().set_color(backend_color(str(part.columns[c]), run.backends))
                cell.get_text().set_fontweight("bold")
        more = f" ({page} of {len(pages)})" if len(pages) > 1 else ""
        ax.set_title("Semantics: what each backend does (orange: differs from most backends; grey: did not run)"
                     + more, fontsize=11)
        out.append(("semantics" if page == 1 else f"semantics-{page}", fig))
    return out


def _row_colours(values: list[str]) -> list[str]:
    """Grey where the backend did not run; orange where its answer is not the most common answer in the row."""
    not_run = [not answered(v) for v in values]
    answers = pd.Series([v for v, skip in zip(values, not_run) if not skip])
    majority = answers.value_counts().index[0] if len(answers) else None
    return ["#eeeeee" if skip else "#ffe0b3" if v != majority else "white" for v, skip in zip(values, not_run)]
