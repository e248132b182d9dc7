"""A report's blocks (headings, paragraphs, tables, preformatted text, images) and their Markdown and HTML: text
from the data is made inert in both."""

from __future__ import annotations

import base64
import html
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd


@dataclass
class Heading:
    level: int
    text: str
    anchor: str = ""


@dataclass
class Para:
    text: str  # plain text; [label](#anchor) links are the only markup


@dataclass
class Table:
    frame: pd.DataFrame
    anchors: list[str] | None = None  # one per row: a target other sections link to


@dataclass
class Pre:
    text: str  # preformatted, as a terminal showed it


@dataclass
class Image:
    path: Path
    caption: str  # alt text; what the figure shows goes in a Para before it


def slug(*parts: object) -> str:
    """An HTML/Markdown anchor id from a row key, e.g. ('sdpa', 'fp32-b2-...-causal', 'fwd+bwd')."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(str(p) for p in parts)).strip("-").lower()


def cell_text(value: object) -> str:
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return "—"
        if value.is_integer() and abs(value) < 1e9:  # counts and lengths stored as floats by the CSV reader
            return str(int(value))
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.3e}"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else ""
    return str(value)


_LINK = re.compile(r"\[([^\]]+)\]\((#[^)]+)\)")


def md_text(text: str) -> str:
    """Text taken from data (backend names, reasons, ids) made inert in Markdown: no raw HTML gets through."""
    return html.escape(str(text), quote=False)


def to_markdown(blocks: list, base: Path) -> str:
    out = []
    for block in blocks:
        if isinstance(block, Heading):
            anchor = f'<a id="{block.anchor}"></a>' if block.anchor else ""
            out.append(f"{'#' * block.level} {md_text(block.text)}{anchor}\n")
        elif isinstance(block, Para):
            out.append(md_text(block.text) + "\n")
        elif isinstance(block, Pre):  # a fence the text cannot close: one backtick longer than any run in it
            fence = "`" * max(3, 1 + max((len(r) for r in re.findall("`+", block.text)), default=0))
            out.append(f"{fence}text\n{block.text}\n{fence}\n")
        elif isinstance(block, Image):
            out.append(f"![{md_text(block.caption)}]({block.path.relative_to(base).as_posix()})\n")
        elif isinstance(block, Table):
            out.append(_markdown_table(block) + "\n")
    return "\n".join(out)


def _markdown_table(table: Table) -> str:
    def cell(v: object) -> str:
        return md_text(cell_text(v)).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(cell(c) for c in table.frame.columns) + " |",
             "|" + "---|" * len(table.frame.columns)]
    for i, row in enumerate(table.frame.itertuples(index=False)):
        cells = [cell(v) for v in row]
        if table.anchors:
            cells[0] = f'<a id="{table.anchors[i]}"></a>{cells[0]}'
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1400px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px}
th{background:#f3f3f3;position:sticky;top:0}tr:target{background:#fff3b0}img{max-width:100%;border:1px solid #eee}
figure{margin:0 0 1.5em}"""


def to_html(blocks: list, title: str) -> str:
    """A single self-contained page: figures are inlined as base64 PNGs."""
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           f"<style>{_CSS}</style></head><body>"]
    for block in blocks:
        if isinstance(block, Heading):
            anchor = f' id="{block.anchor}"' if block.anchor else ""
            out.append(f"<h{block.level}{anchor}>{html.escape(block.text)}</h{block.level}>")
        elif isinstance(block, Para):
            out.append(f"<p>{_html_text(block.text)}</p>")
        elif isinstance(block, Pre):
            out.append(f"<pre>{html.escape(block.text, quote=False)}</pre>")
        elif isinstance(block, Image):
            data = base64.b64encode(block.path.read_bytes()).decode()
            out.append(f"<figure><img alt='{html.escape(block.caption)}' src='data:image/png;base64,{data}'>"
                       "</figure>")
        elif isinstance(block, Table):
            out.append(_html_table(block))
    out.append("</body></html>")
    return "\n".join(out)


def _html_text(text: str) -> str:
    escaped = html.escape(text, quote=False)
    return _LINK.sub(lambda m: f'<a href="{html.escape(m[2])}">{m[1]}</a>', escaped)


def _html_table(table: Table) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.frame.columns)
    rows = []
    for i, row in enumerate(table.frame.itertuples(index=False)):
        anchor = f' id="{table.anchors[i]}"' if table.anchors else ""
        rows.append(f"<tr{anchor}>" + "".join(f"<td>{_html_text(cell_text(v))}</td>" for v in row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
