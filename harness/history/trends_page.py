"""One self-contained HTML page of every changed key's trend per testbed (runs, change points, noise band) with a
table to filter by backend, phase and testbed: no file beside it, no network, opens from the file system."""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np
import pandas as pd

from harness.history.changes import TimedRuns, timed_runs
from harness.history.noise import NoiseModel, noise_path
from harness.measure.stats import PENALTY, SIGMA_FLOOR, change_points, robust_sd
from harness.store.schema import FASTER, KEY, SLOWER

#: the band drawn around each segment's median: this many A/A sigmas of the log latency (the gate's --noise-z)
BAND_Z = 3.0
_W, _H, _PAD = 640, 180, 36

_SCRIPT = """
window.addEventListener('error', e => {
  document.body.dataset.errors = (document.body.dataset.errors || '') + e.message;
});
function applyFilters() {
  const want = {};
  for (const s of document.querySelectorAll('select[data-field]')) want[s.dataset.field] = s.value;
  const keep = el => Object.entries(want).every(([f, v]) => !v || el.dataset[f] === v);
  let shown = 0;
  for (const el of document.querySelectorAll('[data-key]')) {
    const ok = keep(el);
    el.hidden = !ok;
    if (ok && el.tagName === 'SECTION') shown++;
  }
  document.getElementById('shown').textContent = shown;
}
for (const s of document.querySelectorAll('select[data-field]')) s.addEventListener('change', applyFilters);
applyFilters();
document.body.dataset.ready = document.querySelectorAll('section[data-key] svg polyline').length + ' trends';
"""
_STYLE = """body{font:14px sans-serif;margin:1.5em;max-width:1000px}table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px}section{margin:1em 0}svg{background:#fafafa;border:1px solid #ddd}
.slower{color:#b00}.faster{color:#070}"""


def _svg(runs: pd.DataFrame, at: list[int], sigma: float) -> str:
    """Latency per run (oldest left, log scale), each segment's median and noise band, change points dashed red."""
    ms = runs.latency_ms.to_numpy(float)
    bounds = [0, *at, len(ms)]
    meds = [float(np.median(ms[a:b])) for a, b in zip(bounds, bounds[1:])]
    lo = min(ms.min(), *(m * math.exp(-BAND_Z * sigma) for m in meds))
    hi = max(ms.max(), *(m * math.exp(BAND_Z * sigma) for m in meds))
    span = math.log(hi / lo) or 1.0
    x = lambda i: _PAD + (_W - 2 * _PAD) * (i / max(len(ms) - 1, 1))  # noqa: E731
    y = lambda v: _H - _PAD / 2 - (_H - _PAD) * math.log(v / lo) / span  # noqa: E731
    parts = []
    for (a, b), m in zip(zip(bounds, bounds[1:]), meds):
        top, bottom = y(m * math.exp(BAND_Z * sigma)), y(m * math.exp(-BAND_Z * sigma))
        parts.append(f'<rect x="{x(a):.1f}" y="{top:.1f}" width="{max(x(b - 1) - x(a), 2):.1f}" '
                     f'height="{bottom - top:.1f}" fill="#9ab" fill-opacity="0.25"/>')
        parts.append(f'<line x1="{x(a):.1f}" x2="{x(b - 1):.1f}" y1="{y(m):.1f}" y2="{y(m):.1f}" stroke="#666" '
                     'stroke-width="1.5"/>')
    for c in at:
        parts.append(f'<line x1="{x(c - 0.5):.1f}" x2="{x(c - 0.5):.1f}" y1="4" y2="{_H - 4}" stroke="#c00" '
                     'stroke-dasharray="4 3"/>')
    points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(ms))
    parts.append(f'<polyline points="{points}" fill="none" stroke="#1f77b4" stroke-width="1"/>')
    tips = zip(runs.run_id.astype(str), runs.started.astype(str), runs.get("git_sha", pd.Series([""] * len(ms))))
    parts += [f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="2" fill="#1f77b4"><title>{html.escape(r)} '
              f'{html.escape(s)} {html.escape(str(g)[:8])}: {v:.4g} ms</title></circle>'
              for i, (v, (r, s, g)) in enumerate(zip(ms, tips))]
    labels = (f'<text x="2" y="12" font-size="10">{hi:.3g} ms</text>'
              f'<text x="2" y="{_H - 4}" font-size="10">{lo:.3g} ms</text>')
    return f'<svg width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}">{"".join(parts)}{labels}</svg>'


def _sigma(runs: pd.DataFrame, key: tuple, models: dict) -> tuple[float, str]:
    """The key's A/A sigma of a log latency: its testbed's noise model's, else the series' own run-to-run spread."""
    model = models.get(key[0])
    noise = model.key(tuple(key[1:])) if model is not None else None
    if noise is not None and math.isfinite(noise.aa_sigma):
        return noise.aa_sigma / math.sqrt(2), "noise model"  # the model's sigma is of a ratio of two runs
    steps = np.diff(np.log(runs.latency_ms.to_numpy(float)))
    return max(robust_sd(steps - np.median(steps)) / math.sqrt(2), SIGMA_FLOOR) if len(steps) else SIGMA_FLOOR, \
        "run-to-run spread"


def write_trends_page(history: pd.DataFrame | TimedRuns, changes: pd.DataFrame, path: str | Path, results_dir: str | Path,
                      penalty: float = PENALTY, needed: str = "") -> Path:
    """The page of every changed key (changes' rows) with its trend, filterable; written to `path`. `needed`: how
    many runs a key needs and has (changes.runs_needed), said on the page so an empty one says why."""
    path = Path(path)
    models = {tb: NoiseModel.load(noise_path(results_dir, tb)) for tb in set(changes.get("testbed_id", []))
              if noise_path(results_dir, tb).exists()}
    series = dict(timed_runs(history).items(set(map(tuple, changes[["testbed_id", *KEY]].to_numpy()))))
    fields = ("backend", "phase", "testbed_id")
    filters = "".join(
        f'<label>{f.replace("_id", "")} <select data-field="{f}"><option value="">all</option>'
        + "".join(f"<option>{html.escape(str(v))}</option>" for v in sorted(set(changes[f].astype(str))))
        + "</select></label> " for f in fields)
    rows, sections = [], []
    for r in changes.itertuples():
        key = (r.testbed_id, *(getattr(r, k) for k in KEY))
        data = " ".join(f'data-{f}="{html.escape(str(getattr(r, f)))}"' for f in fields)
        word = SLOWER if r.ratio > 1 else FASTER
        rows.append(f'<tr data-key="1" {data}><td>{html.escape(r.testbed_id)}</td><td>{html.escape(r.backend)}</td>'
                    f'<td>{html.escape(r.case_id)}</td><td>{html.escape(r.phase)}</td><td>{r.before_ms:.4g}</td>'
                    f'<td>{r.after_ms:.4g}</td><td class="{word}">{r.ratio:.2f}x</td>'
                    f'<td>{html.escape(str(r.run_id_before))} → {html.escape(str(r.run_id_after))}</td>'
                    f'<td>{html.escape(str(r.backend_version_before))} → {html.escape(str(r.backend_version_after))}'
                    '</td></tr>')
    for key in dict.fromkeys(map(tuple, changes[["testbed_id", *KEY]].to_numpy())):
        runs = series[key]
        at = change_points(runs.latency_ms.to_numpy(), penalty)
        sigma, source = _sigma(runs, key, models)
        data = " ".join(f'data-{f}="{html.escape(str(v))}"' for f, v in zip(fields, (key[2], key[3], key[0])))
        sections.append(f'<section data-key="1" {data}><h3>{html.escape(key[2])} {html.escape(key[1])} '
                        f'[{html.escape(key[3])}] on {html.escape(key[0])}</h3>{_svg(runs, at, sigma)}<p>{len(runs)} '
                        f'runs; band: ±{BAND_Z:g} A/A sigmas ({source}, {sigma:.1%} a run)</p></section>')
    body = (f"<h1>Change points per key</h1><p>{len(changes)} change point(s) in {len(sections)} key(s)"
            + (f" ({html.escape(needed)})" if needed else "") + "; "
            f"<span id=shown>{len(sections)}</span> shown. Each trend: the key's median latency per run (oldest "
            "left, log scale), its segments' medians (gray) with the noise band, change points dashed red.</p>"
            f"<p>{filters}</p><table><tr><th>testbed</th><th>backend</th><th>case</th><th>phase</th><th>before ms</th>"
            f"<th>after ms</th><th>ratio</th><th>between runs</th><th>kernel versions</th></tr>{''.join(rows)}"
            f"</table>{''.join(sections)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'<!doctype html><html><head><meta charset="utf-8"><title>Change points</title>'
                    f"<style>{_STYLE}</style></head><body>{body}<script>{_SCRIPT}</script></body></html>\n")
    return path
