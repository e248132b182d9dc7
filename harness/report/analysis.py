"""What a stored run says: shape groups, the support matrix, semantics table, winners, headline, failures."""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.report.data import GROUP_KEYS, SEMANTICS_PREFIX, Run, mask_kind
from harness.store.schema import BAD, BWD, FWD, FWD_BWD, NOT_RUN, PASS, PHASES, UNAVAILABLE, VERDICT_PHASES


def split_series(df: pd.DataFrame) -> tuple[list[tuple[tuple, pd.DataFrame]], pd.DataFrame]:
    """(shape groups - case rows that differ only in sequence length - measured at two or more lengths, the rows of
    every other case): lines vs dots. A length of 0 (empty-tensor probes) has no place on a log axis: always dots."""
    if df.empty:
        return [], df
    keyed = df.assign(**{k: df[k].fillna(-1) if df[k].dtype.kind == "f" else df[k].fillna("n/a")
                         for k in GROUP_KEYS})
    series, singles = [], []
    for key, g in keyed.groupby(list(GROUP_KEYS), sort=True, dropna=False):
        positive = g.seq_k > 0
        if g.seq_k[positive].nunique() >= 2:
            series.append((key, g[positive]))
            singles.append(g[~positive])
        else:
            singles.append(g)
    return series, pd.concat(singles)


def case_label(row: pd.Series) -> str:
    """Short axis label of a case: 'bf16 d64 causal s1x257', with 'h8kv2' when heads are grouped."""
    seq = f"{row['seq_q']:g}" if row["seq_q"] == row["seq_k"] else f"{row['seq_q']:g}x{row['seq_k']:g}"
    heads = f" h{row['heads']:g}kv{row['kv_heads']:g}" if row["kv_heads"] != row["heads"] else ""
    suite = f"{row['suite']}: " if row["suite"] else ""
    mods = f" {row['modifier_kind']}" if row.get("modifier_kind", "none") != "none" else ""
    return f"{suite}{row['dtype']} d{row['head_dim']:g} {row['mask_kind']}{mods} s{seq}{heads}"


def group_label(key: tuple) -> str:
    """'bf16 · d64 · causal' (' · cap-sink' with modifiers), then a line 'b2 h8 kv2 · seq_q = seq_k'."""
    suite, dtype, head_dim, kind, mods, batch, heads, kv_heads, shape = key
    heads_txt = f"h{heads:g}" + (f" kv{kv_heads:g}" if kv_heads != heads else "")
    mods_txt = f" · {mods}" if mods != "none" else ""
    return (f"{suite + ': ' if suite else ''}{dtype} · d{head_dim:g} · {kind}{mods_txt}\nb{batch:g} {heads_txt} · "
            f"{shape}")


def case_group(row: pd.Series) -> str:
    """Column of the support matrix a case row belongs to: its suite (if tagged), dtype, mask and modifier family."""
    dtype = row["dtype"]  # not row.dtype: that is the Series' own dtype
    mods = f" · {row['modifier_kind']}" if row.get("modifier_kind", "none") != "none" else ""
    return (f"{row['suite'] + ': ' if row['suite'] else ''}{dtype if isinstance(dtype, str) else '?'} · "
            f"{row['mask_kind']}{mods}")


def support_counts(run: Run) -> pd.DataFrame:
    """backend x case group -> {status: number of (case, phase) rows}, verdict phases only."""
    rows = run.verdicts
    if rows.empty:
        return pd.DataFrame()
    rows = rows.assign(group=rows.apply(case_group, axis=1))
    backends, groups = list(dict.fromkeys(rows.backend)), sorted(set(rows.group))
    table = pd.DataFrame([[{} for _ in groups] for _ in backends], index=backends, columns=groups, dtype=object)
    for (backend, group, status), n in rows.groupby(["backend", "group", "status"], sort=False).size().items():
        table.at[backend, group][status] = int(n)  # each cell its own dict, filled in place
    return table


def unavailable_everywhere(table: pd.DataFrame) -> list[str]:
    """Backends of a support_counts table that could not run here at all (every verdict row unavailable)."""
    return [b for b in table.index if any(table.loc[b].map(bool))
            and all(set(cell) <= {UNAVAILABLE} for cell in table.loc[b])]


def semantics_table(run: Run) -> pd.DataFrame:
    """Question (case id without the prefix, plus the phase where a question has several) x backend -> observed."""
    sem = run.semantics
    if sem.empty:
        return pd.DataFrame()
    question = sem.case_id.astype(str).str.removeprefix(SEMANTICS_PREFIX)
    several = sem.groupby(question.values).phase.transform("nunique").values > 1
    question = question.where(~several, question + " [" + sem.phase + "]")
    # a question a backend could not answer (a row with another status) says so: "unavailable: <reason>"
    not_observed = sem.status + ": " + sem.reason.astype(object).fillna("").astype(str)
    value = sem.observed.where(sem.observed.notna(), not_observed.str.rstrip(": ")).astype(str)
    table = pd.DataFrame({"question": question.values, "backend": sem.backend.values, "value": value.values})
    return table.pivot_table(index="question", columns="backend", values="value", aggfunc="first", sort=False)\
        .reindex(columns=[b for b in run.backends if b in set(sem.backend)]).fillna("")  # run's backend order


def answered(value: object) -> bool:
    """Whether a semantics cell holds an observation, not 'unavailable: ...' / 'unsupported: ...' / empty."""
    return bool(str(value)) and not str(value).startswith(NOT_RUN)


def short_cell(value: object) -> str:
    """A semantics cell for display: the observation, or just the status of a backend that gave none."""
    return str(value) if answered(value) else str(value).split(":")[0]


def timed_correct(run: Run) -> pd.DataFrame:
    """Timed rows whose correctness holds for that phase (fwd+bwd needs both); the only ones worth ranking."""
    cases = run.cases[run.cases.suite == ""]  # the benchmark times the matrix; a tagged probe is not a contender
    rows = cases[np.isfinite(cases.latency_ms) & ~cases.status.isin(BAD)]
    if rows.empty:
        return rows
    verdicts = run.verdicts[run.verdicts.phase.isin(VERDICT_PHASES)]
    # (case_id, backend) -> whether its fwd and its bwd verdict passed (NaN: not run)
    ok = verdicts.pivot_table(index=["case_id", "backend"], columns="phase", values="status", aggfunc="first")\
        .reindex(columns=list(VERDICT_PHASES)).eq(PASS)
    def passed(r) -> bool:
        if (r.case_id, r.backend) not in ok.index:
            return False
        verdict = ok.loc[(r.case_id, r.backend)]
        return bool(verdict[FWD] and verdict[BWD]) if r.phase == FWD_BWD else bool(verdict.get(r.phase))
    return rows[rows.apply(passed, axis=1)]


def winners(run: Run) -> pd.DataFrame:
    """Fastest correct backend per shape group (dtype, head_dim, mask, batch, heads, seq_q, seq_k, phase)."""
    rows = timed_correct(run)
    rows = rows[~rows.suspicious]  # a figure beyond the measured peak wins nothing (schema.figures_comparable)
    if rows.empty:
        return pd.DataFrame()
    keys = ["dtype", "head_dim", "mask", "modifier_kind", "batch", "heads", "kv_heads", "seq_q", "seq_k", "phase"]
    out = []
    for key, g in rows.groupby(keys, sort=False, dropna=False):
        g = g.sort_values("latency_ms")
        best = g.iloc[0]
        second = g.iloc[1] if len(g) > 1 else None
        out.append({**dict(zip(keys, key)), "winner": best.backend, "latency_ms": best.latency_ms,
                    "noisy": bool(best.noisy),
                    "runner_up": "" if second is None else second.backend,
                    "margin": np.nan if second is None else second.latency_ms / best.latency_ms,
                    "speedup": best.speedup, "candidates": len(g)})
    # sort window/keypad ids by family, then by length
    table = pd.DataFrame(out).assign(mask_kind=lambda t: t["mask"].map(mask_kind)).sort_values(
        ["dtype", "mask_kind", "head_dim", "batch", "heads", "kv_heads", "seq_k", "seq_q", "phase"],
        key=lambda s: s.map(dict(zip(PHASES, range(len(PHASES))))) if s.name == "phase" else s)
    return table.drop(columns="mask_kind").reset_index(drop=True)


def headline(run: Run) -> pd.DataFrame:
    """Per backend: the matrix's cases passed / failed / not run (one verdict per case, its worst phase, as the
    run's summary counts), the probes' cases (a tagged suite) apart, median speedup per phase and memory, wins."""
    verdicts = run.verdicts
    per_case, per_probe = (verdicts[part].groupby(["backend", "case_id"], sort=False).status.agg(set)
                           for part in (verdicts.suite == "", verdicts.suite != ""))
    wins = winners(run).winner.value_counts() if run.has_perf else pd.Series(dtype=int)
    out = []
    for backend in run.backends:
        statuses, probes = (sets[sets.index.get_level_values(0) == backend] for sets in (per_case, per_probe))
        if statuses.empty and probes.empty:
            continue
        bad = statuses.map(lambda s: bool(s & set(BAD))).astype(bool)
        passed = statuses.map(lambda s: PASS in s).astype(bool) & ~bad
        rows = run.cases[run.cases.backend == backend]
        partial = passed & statuses.map(lambda s: bool(s & set(NOT_RUN))).astype(bool)
        entry = {"backend": backend, "cases": len(statuses), "passed": int(passed.sum()),
                 "of which partly run": int(partial.sum()), "failed": int(bad.sum()),
                 "not run": int((~passed & ~bad).sum())}
        if len(per_probe):
            entry["probe cases"] = len(probes)
            entry["probe cases failed"] = int(probes.map(lambda s: bool(s & set(BAD))).sum())
        if run.has_perf:
            for phase in PHASES:
                if np.isfinite(run.df.loc[run.df.phase == phase, "speedup"]).any():
                    entry[f"median speedup {phase}"] = rows.loc[rows.phase == phase, "speedup"].median()
            entry["median peak MiB"] = rows.peak_mem_mib.median()
            if run.has_baseline:
                entry["median memory vs baseline"] = rows.mem_vs_base.median()
            entry["wins"] = int(wins.get(backend, 0))
        out.append(entry)
    return pd.DataFrame(out)


def failures(run: Run) -> pd.DataFrame:
    """Rows that failed, errored or ran out of memory, with the figures that say why and the command that reruns
    them (empty in runs older than the repro column)."""
    cols = ["backend", "case_id", "phase", "status", "err_ratio", "reason", "repro"]
    rows = run.cases[run.cases.status.isin(BAD)]
    rows = rows if "repro" in rows else rows.assign(repro=None)
    # a fwd+bwd row that was not timed because fwd or bwd failed repeats that failure; list it once
    repeat = (rows.phase == FWD_BWD) & rows.reason.fillna("").astype(str).str.startswith("not timed:")
    return rows.loc[~repeat, cols].reset_index(drop=True)


def not_run(run: Run) -> pd.DataFrame:
    """Distinct reasons a backend did not run (unsupported / unavailable), with how many rows each covers."""
    rows = pd.concat([run.verdicts, run.semantics])
    rows = rows[rows.status.isin(NOT_RUN)]
    if rows.empty:  # (main-matrix fwd+bwd rows only repeat these reasons as "not timed: ...")
        return pd.DataFrame(columns=["backend", "status", "reason", "rows"])
    return rows.groupby(["backend", "status", rows.reason.fillna("")], sort=False).size().reset_index(name="rows")


def modifier_support(run: Run) -> pd.DataFrame:
    """backend x modifier family (cases with modifiers or their own value head dim): the verdict rows' statuses
    ('pass 2, unsupported 2') and modifier_path; empty when the run has no such case."""
    rows = run.verdicts[run.verdicts.modifier_kind != "none"]
    out = []
    # a backend unavailable here is one line, not a row per modifier family (~60 rows of "unavailable", issue 67)
    absent = {b for b, g in rows.groupby("backend") if set(g.status) == {UNAVAILABLE}}
    for backend in sorted(absent):
        g = rows[rows.backend == backend]
        out.append({"backend": backend, "modifiers": f"all {g.modifier_kind.nunique()} families",
                    "statuses": f"unavailable {len(g)}", "path": "",
                    "reason": "; ".join(sorted(set(g.reason.dropna().astype(str)) - {""}))[:200]})
    for (backend, kind), g in rows[~rows.backend.isin(absent)].groupby(["backend", "modifier_kind"], sort=True):
        counts = g.status.value_counts()
        paths = sorted(set(g.modifier_path.dropna().astype(str)) - {""})
        out.append({"backend": backend, "modifiers": kind,
                    "statuses": ", ".join(f"{s} {n}" for s, n in counts.items()),
                    "path": "; ".join(paths), "reason": "; ".join(sorted(set(g.reason[g.status != PASS]
                                                                              .dropna().astype(str)) - {""}))[:200]})
    return pd.DataFrame(out).sort_values("backend", kind="stable").reset_index(drop=True) if out else \
        pd.DataFrame(out)
