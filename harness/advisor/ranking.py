"""Ranking backends on a workload: tie groups by compare's statistics, preferences inside a tie, the explanation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import pandas as pd

from harness.advisor.deploy_checks import CHECK_COLUMNS
from harness.advisor.evidence import Evidence
from harness.measure.stats import TieConfig, TimingVerdict, iqr, timing_verdict
from harness.store.schema import (FASTER, NOT_TIMED, PASS, SLOWER, TIED, TIED_NOISY, TIED_UNCONFIRMED, UNCHANGED,
                                  UNDECIDED)

#: timing verdicts that mean "not shown to differ": such a pair is tied
TIE_VERDICTS = (UNCHANGED, UNDECIDED)
#: how a backend compares with another in this run ("unchanged" is the gate's word for two runs, not two backends);
#: an undecided pair's word names the test that left it undecided (advisor_word)
ADVISOR_WORDS = {UNCHANGED: TIED, UNDECIDED: TIED_NOISY, SLOWER: SLOWER, FASTER: FASTER}


def advisor_word(v: TimingVerdict, cfg: TieConfig) -> str:
    """The advisor's word for a pair's verdict, never at odds with the p-value printed beside it: an undecided pair
    with p < alpha is tied because the difference was not confirmed (its note says by what), not for noise."""
    if v.verdict == UNDECIDED and v.p_value < cfg.alpha:
        return TIED_UNCONFIRMED
    return ADVISOR_WORDS.get(v.verdict, v.verdict)


COLUMNS = ("rank", "tie_group", "backend", "status", "reason", "err_ratio", "latency_ms", "iqr_ms", "n_samples",
           "gbps", "pct_of_bw_peak", "vs_fastest", "anchor", "p_value", "timing_verdict", "peak_mem_bytes",
           *CHECK_COLUMNS, "batch_invariant", "batch_invariance_note", "deps", "source", "case_id", "phase")


@dataclass
class Recommendation:
    """The ranked backends of one workload (`table`, COLUMNS), the winner (None when nothing is eligible) and why."""
    table: pd.DataFrame
    winner: str | None
    explanation: str
    workload: str = ""
    case_id: str = ""
    phase: str = ""
    device: str = ""
    device_name: str = ""
    threads: int = 0
    notes: list[str] = field(default_factory=list)
    #: the small case the compile checks ran on (None without checks)
    check_case: str | None = None
    #: the p-value below which the ranking counted a difference (TieConfig.alpha), printed beside each p
    alpha: float = TieConfig.alpha
    #: each ranked backend's timing samples (ms): what the traffic mix (advisor/mix.py) resamples
    samples: dict[str, tuple[float, ...]] = field(default_factory=dict)


@dataclass
class Overall:
    """One row per backend over every workload of a file, and the overall pick."""
    table: pd.DataFrame
    winner: str | None
    explanation: str


def preference(e: Evidence) -> tuple:
    """Order inside a tie: lower peak memory (unknown: the most), a deterministic result, no package, lower median."""
    memory = e.peak_mem_bytes if math.isfinite(e.peak_mem_bytes) else math.inf
    return memory, e.checks.get("deterministic") != "yes", e.package is not None, e.median


def tie_groups(evidence: Iterable[Evidence], cfg: TieConfig = TieConfig()) -> list[list[Evidence]]:
    """Eligible backends in tie groups, fastest first, each sorted by `preference`: a group is the fastest remaining
    backend and every remaining one compare's timing_verdict does not find slower than that anchor."""
    remaining = sorted((e for e in evidence if e.eligible), key=lambda e: e.median)
    groups = []
    while remaining:
        anchor = remaining[0]
        members = [anchor] + [e for e in remaining[1:]
                              if timing_verdict(anchor.samples_ms, e.samples_ms, cfg).verdict in TIE_VERDICTS]
        remaining = [e for e in remaining if all(e is not m for m in members)]
        groups.append(sorted(members, key=preference))
    return groups


def rank_backends(evidence: Iterable[Evidence], cfg: TieConfig = TieConfig()) -> Recommendation:
    """The ranked table (COLUMNS): eligible backends by tie group then preference, then the excluded with why.
    `anchor`, `p_value`, `timing_verdict`: each row against the fastest of its tie group; `vs_fastest`: its median
    over the overall fastest one's."""
    evidence = list(evidence)
    groups = tie_groups(evidence, cfg)
    fastest = min((e for g in groups for e in g), key=lambda e: e.median, default=None)
    rows, rank = [], 0
    for number, group in enumerate(groups, 1):
        anchor = min(group, key=lambda e: e.median)
        for e in group:
            rank += 1
            vs = timing_verdict(anchor.samples_ms, e.samples_ms, cfg) if e is not anchor else None
            rows.append(_row(e, rank=rank, tie_group=number, vs_fastest=e.median / fastest.median,
                             anchor=anchor.backend, p_value=vs.p_value if vs else math.nan,
                             timing_verdict=advisor_word(vs, cfg) if vs else "anchor"))
    for e in evidence:
        if not e.eligible:
            reason = e.reason or ("verified but has no timing samples" if e.status == PASS else "")
            rows.append(_row(e, status=e.status if e.status != PASS else NOT_TIMED, reason=reason))
    df = pd.DataFrame(rows).reindex(columns=list(COLUMNS))
    winner, explanation = explain(groups, fastest, [e for e in evidence if not e.eligible], cfg)
    return Recommendation(df, winner, explanation, alpha=cfg.alpha,
                          samples={e.backend: tuple(e.samples_ms) for e in evidence if e.eligible})


def _row(e: Evidence, **values) -> dict:
    return {"backend": e.backend, "status": e.status, "reason": e.reason, "err_ratio": e.err_ratio,
            "latency_ms": e.median, "iqr_ms": iqr(e.samples_ms), "n_samples": len(e.samples_ms),
            "peak_mem_bytes": e.peak_mem_bytes, "gbps": e.gbps, "pct_of_bw_peak": e.pct_of_bw_peak,
            **e.checks, "deps": "torch" + (f" + {e.package}" if e.package else ""), "source": e.source, **values}


def _mib(n: float) -> str:
    return f"{n / 2 ** 20:.3g} MiB" if math.isfinite(n) else "unknown"


def _decider(winner: Evidence, runner_up: Evidence) -> str:
    """Which preference criterion put `winner` ahead of `runner_up` inside their tie."""
    reasons = (f"lower peak memory ({_mib(winner.peak_mem_bytes)} vs {_mib(runner_up.peak_mem_bytes)})",
               f"a deterministic result ({runner_up.backend}'s is {runner_up.checks.get('deterministic', 'unknown')})",
               f"needing nothing beyond torch ({runner_up.backend} needs {runner_up.package})")
    return next((why for a, b, why in zip(preference(winner), preference(runner_up), reasons) if a != b),
                f"the lower median ({winner.median:.4g} vs {runner_up.median:.4g} ms)")


def explain(groups: list[list[Evidence]], fastest: Evidence | None, excluded: list[Evidence],
            cfg: TieConfig = TieConfig()) -> tuple[str | None, str]:
    """(winner, one paragraph saying why) for tie groups from `tie_groups`."""
    if not groups:
        names = ", ".join(f"{e.backend} ({e.status})" for e in excluded) or "none given"
        return None, f"no backend is both verified correct and timed on this workload; excluded: {names}"
    winner, *tied = groups[0]
    if not tied:
        if len(groups) == 1:
            return winner.backend, f"{winner.backend}: the only backend verified correct and timed here"
        nxt = min(groups[1], key=lambda e: e.median)
        v = timing_verdict(winner.samples_ms, nxt.samples_ms, cfg)
        return winner.backend, (f"{winner.backend}: the fastest, significantly ahead of the next fastest, "
                                f"{nxt.backend} ({v.ratio:.2f}x its median, p={v.p_value:.2g})")
    verdicts = {e.backend: timing_verdict(fastest.samples_ms, e.samples_ms, cfg) for e in groups[0] if e is not fastest}

    def versus(e: Evidence) -> str:
        if e is fastest:
            return "the fastest"
        v = verdicts[e.backend]
        if v.verdict != UNDECIDED:  # tied: the medians differ by less than min_effect, whatever p says
            return f"{e.median / fastest.median:.2f}x, {advisor_word(v, cfg)}"
        why = f": {v.note}" if v.note else ""
        return f"{e.median / fastest.median:.2f}x, {advisor_word(v, cfg)}, p={v.p_value:.2g}{why}"

    others = ", ".join(f"{e.backend} ({versus(e)})" for e in groups[0] if e is not winner)
    text = (f"{winner.backend} ({versus(winner)}) is tied within noise with {others} (compare's rule: a difference "
            f"counts only when p < {cfg.alpha:g} and the medians differ by {cfg.min_effect:.0%} or more); among the "
            f"tied it is chosen " + ", ".join(f"over {e.backend} for {_decider(winner, e)}" for e in tied))
    if any(v.verdict == UNDECIDED for v in verdicts.values()):
        text += (f"; '{TIED_NOISY}' is a difference the samples' rank test could not establish (p >= {cfg.alpha:g}), "
                 f"'{TIED_UNCONFIRMED}' one it established that the run's rounds did not confirm: rerun on a quieter "
                 "machine or with a larger --timing-budget-ms")
    return winner.backend, text


def _gmean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(values)))) if values else math.nan


def overall(recommendations: dict[str, Recommendation]) -> Overall:
    """One row per backend over all workloads; the pick is ranked on every workload, with the best geometric-mean
    rank, then the lower geometric-mean latency over each one's fastest."""
    tables = {label: r.table for label, r in recommendations.items()}
    names = list(dict.fromkeys(b for df in tables.values() for b in df.backend))
    rows = []
    for name in names:
        ranks, ratios, missing = [], [], []
        for label, df in tables.items():
            hit = df[df.backend == name]
            if hit.empty or pd.isna(hit.iloc[0]["rank"]):
                missing.append(f"{label}: {hit.iloc[0].status if len(hit) else 'not run'}")
            else:
                ranks.append(float(hit.iloc[0]["rank"]))
                ratios.append(float(hit.iloc[0].vs_fastest))
        rows.append({"backend": name, "ranked_on": f"{len(ranks)}/{len(tables)}",
                     "ranks": ", ".join(f"{int(r)}" for r in ranks), "all": not missing,
                     "geomean_rank": _gmean(ranks) if not missing else math.nan,
                     "geomean_vs_fastest": _gmean(ratios) if not missing else math.nan,
                     "excluded_on": "; ".join(missing)})
    df = pd.DataFrame(rows).sort_values(["all", "geomean_rank", "geomean_vs_fastest"], ascending=[False, True, True],
                                        kind="stable").reset_index(drop=True)
    df.insert(0, "overall_rank", [float(i + 1) if ok else math.nan for i, ok in enumerate(df["all"])])
    df = df.drop(columns="all")
    if df.overall_rank.notna().any():
        best = df.iloc[0]
        nxt = df.iloc[1] if len(df) > 1 and pd.notna(df.iloc[1].overall_rank) else None
        text = (f"{best.backend}: ranked on all {len(tables)} workloads (ranks {best.ranks}); geometric-mean rank "
                f"{best.geomean_rank:.2f}, latency {best.geomean_vs_fastest:.2f}x each workload's fastest"
                + (f"; next: {nxt.backend} (geometric-mean rank {nxt.geomean_rank:.2f})" if nxt is not None else ""))
        return Overall(df, best.backend, text)
    per = ", ".join(f"{label}: {r.winner}" for label, r in recommendations.items())
    return Overall(df, None, f"no backend is verified and timed on every workload; per workload: {per}")
