"""Deployment advisor: rank the verified backends for a workload, with ties, exclusions and deployment checks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd
import torch

from harness.backends.base import Backend, get_backends
from harness.case import AttentionCase
from harness.compare import CompareConfig, run_testbed, timing_verdict
from harness.deploy_checks import CHECK_COLUMNS, check_case, deployment_checks, mask_path
from harness.env import device_name, resolve_device, testbed_id
from harness.masks import MASK_NAMES, parse_mask
from harness.perf import measure_phase
from harness.results import load_results, load_samples
from harness.runner import execute, prepare_case
from harness.timing import TimingConfig

#: At least 15 repetitions per backend: compare's alpha (0.002) needs >= 7 samples per side before any difference
#: can be significant at all, and twice that before a noisy CPU's differences can be; with fewer every pair would
#: be "inconclusive", i.e. tied.
TIMING = TimingConfig(warmup_ms=50.0, budget_ms=500.0, min_reps=15)
#: compare.timing_verdict outcomes that mean "not shown to differ": such a pair is tied
TIED = ("unchanged", "inconclusive")
COLUMNS = ("rank", "tie_group", "backend", "status", "reason", "err_ratio", "latency_ms", "iqr_ms", "n_samples",
           "vs_fastest", "anchor", "p_value", "timing_verdict", "peak_mem_bytes", *CHECK_COLUMNS, "deps", "source",
           "case_id", "phase")


@dataclass(frozen=True)
class Workload:
    """One shape to advise on: q (batch, heads, seq_q, head_dim), k/v (batch, kv_heads, seq_k, head_dim).

    `mask` is a parse_mask name (padding lengths derive from the shape); `training` times forward+backward.
    """

    batch: int
    heads: int
    seq_q: int
    head_dim: int
    kv_heads: int | None = None
    seq_k: int | None = None
    dtype: str = "bf16"
    mask: str = "causal"
    training: bool = False
    name: str = ""

    def __post_init__(self):
        if not isinstance(self.training, bool):
            raise ValueError(f"training={self.training!r}: must be true or false")
        self.case()  # every other check (ints, dtype, mask, heads % kv_heads) is the case spec's own

    def case(self) -> AttentionCase:
        shape = AttentionCase(self.batch, self.heads, self.seq_q, self.head_dim, self.dtype, kv_heads=self.kv_heads,
                              seq_k=self.seq_k)
        if not isinstance(self.mask, str):
            raise ValueError(f"unknown mask {self.mask!r}; allowed: {', '.join(MASK_NAMES)}")
        return replace(shape, mask=parse_mask(self.mask, batch=shape.batch, seq_k=shape.seq_k))

    @property
    def phase(self) -> str:
        return "fwd+bwd" if self.training else "fwd"

    @property
    def label(self) -> str:
        return self.name or self.case().id


WORKLOAD_KEYS = ("name", "batch", "heads", "kv_heads", "seq", "seq_q", "seq_k", "head_dim", "dtype", "mask",
                 "training")
FILE_KEYS = ("defaults", "shape")


def _shape_keys(entry: object, where: str) -> dict:
    """A table's keys with '-' read as '_' and `seq` expanded to seq_q = seq_k."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a table of {', '.join(WORKLOAD_KEYS)}; got {entry!r}")
    out = {str(k).replace("-", "_"): v for k, v in entry.items()}
    unknown = sorted(set(out) - set(WORKLOAD_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
                         f"allowed: {', '.join(WORKLOAD_KEYS)}")
    if "seq" in out:
        if "seq_q" in out or "seq_k" in out:
            raise ValueError(f"{where}: give seq, or seq_q/seq_k, not both")
        out["seq_q"] = out["seq_k"] = out.pop("seq")
    return out


def workloads_from_mapping(data: object, where: str = "workload", *, training: bool | None = None) -> list[Workload]:
    """{defaults?: {...}, shape: [{...}, ...]} -> workloads; `training` is a default under the file's own."""
    if not isinstance(data, dict) or set(data) - set(FILE_KEYS):
        extra = sorted(set(data) - set(FILE_KEYS)) if isinstance(data, dict) else data
        raise ValueError(f"{where}: unexpected top level {extra!r}; allowed keys: {', '.join(FILE_KEYS)}")
    shapes = data.get("shape")
    if not isinstance(shapes, list) or not shapes:
        raise ValueError(f"{where}: needs a non-empty list 'shape' ([[shape]] tables in TOML); got {shapes!r}")
    defaults = {**({} if training is None else {"training": training}),
                **_shape_keys(data.get("defaults", {}), f"{where} [defaults]")}
    workloads = []
    for i, entry in enumerate(shapes, 1):
        spot = f"{where} shape {i}"
        keys = {**defaults, **_shape_keys(entry, spot)}
        missing = [k for k in ("batch", "heads", "seq_q", "head_dim") if k not in keys]
        if missing:
            raise ValueError(f"{spot}: missing {', '.join(missing)} (seq may stand for seq_q and seq_k)")
        try:
            workloads.append(Workload(**{k: keys[k] for k in keys if k != "name"}, name=str(keys.get("name", ""))))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{spot}: {exc}") from None
    labels = [w.label for w in workloads]
    if len(set(labels)) != len(labels):
        raise ValueError(f"{where}: shape names must be unique; got {labels}")
    return workloads


def load_workloads(path: str | Path, *, training: bool | None = None) -> list[Workload]:
    """Workloads from a .toml file (tomllib) or .yaml/.yml (PyYAML's safe_load, when installed)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"workload file {path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".toml":
        import tomllib

        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"workload file {path}: not valid TOML: {exc}") from None
    elif suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ValueError(f"workload file {path}: reading YAML needs PyYAML (pip install pyyaml); "
                             "or write it as .toml") from None
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ValueError(f"workload file {path}: not valid YAML: {exc}") from None
    else:
        raise ValueError(f"workload file {path}: suffix {suffix!r}; allowed: .toml, .yaml, .yml")
    return workloads_from_mapping(data, str(path), training=training)


@dataclass
class Evidence:
    """What is known of one backend on one workload: its verdict, and its samples when it passed and was timed."""

    backend: str
    status: str
    reason: str = ""
    err_ratio: float = math.nan
    samples_ms: tuple[float, ...] = ()
    peak_mem_bytes: float = math.nan
    package: str | None = None
    checks: dict = field(default_factory=dict)
    source: str = "measured now"

    @property
    def eligible(self) -> bool:
        """Only a backend verified correct on the workload and timed on it can be recommended."""
        return self.status == "pass" and len(self.samples_ms) > 0

    @property
    def median(self) -> float:
        return float(np.median(self.samples_ms)) if self.samples_ms else math.nan


def preference(e: Evidence) -> tuple:
    """Order inside a tie: lower peak memory, then a deterministic result, then no package beyond torch, then the
    lower median (unknown memory counts as the most)."""
    memory = e.peak_mem_bytes if math.isfinite(e.peak_mem_bytes) else math.inf
    return memory, e.checks.get("deterministic") != "yes", e.package is not None, e.median


def tie_groups(evidence: Iterable[Evidence], cfg: CompareConfig = CompareConfig()) -> list[list[Evidence]]:
    """Eligible backends in tie groups, fastest group first, each sorted by `preference`.

    A group is the fastest remaining backend (by median) and every remaining one that compare's timing_verdict
    does not find slower than it (unchanged or inconclusive); ties are judged against that anchor only.
    """
    remaining = sorted((e for e in evidence if e.eligible), key=lambda e: e.median)
    groups = []
    while remaining:
        anchor = remaining[0]
        members = [anchor] + [e for e in remaining[1:]
                              if timing_verdict(anchor.samples_ms, e.samples_ms, cfg)["verdict"] in TIED]
        remaining = [e for e in remaining if all(e is not m for m in members)]
        groups.append(sorted(members, key=preference))
    return groups


def rank_backends(evidence: Iterable[Evidence], cfg: CompareConfig = CompareConfig()) -> pd.DataFrame:
    """The ranked table (COLUMNS): eligible backends by tie group then preference, excluded ones after with their
    status and reason. `anchor`, `p_value` and `timing_verdict` say how each row compared with the fastest of its
    tie group (what decided the tie); `vs_fastest` is its median over the overall fastest one's.
    attrs: winner (None when nothing is eligible) and explanation."""
    evidence = list(evidence)
    groups = tie_groups(evidence, cfg)
    fastest = min((e for g in groups for e in g), key=lambda e: e.median, default=None)
    rows, rank = [], 0
    for number, group in enumerate(groups, 1):
        anchor = min(group, key=lambda e: e.median)
        for e in group:
            rank += 1
            vs = {"p_value": math.nan, "verdict": "anchor"} if e is anchor else \
                timing_verdict(anchor.samples_ms, e.samples_ms, cfg)
            rows.append(_row(e, rank=rank, tie_group=number, vs_fastest=e.median / fastest.median,
                             anchor=anchor.backend, p_value=vs["p_value"], timing_verdict=vs["verdict"]))
    for e in evidence:
        if not e.eligible:
            reason = e.reason or ("verified but has no timing samples" if e.status == "pass" else "")
            rows.append(_row(e, status=e.status if e.status != "pass" else "not-timed", reason=reason))
    df = pd.DataFrame(rows).reindex(columns=list(COLUMNS))
    winner, explanation = explain(groups, fastest, [e for e in evidence if not e.eligible], cfg)
    df.attrs.update(winner=winner, explanation=explanation)
    return df


def _row(e: Evidence, **values) -> dict:
    samples = np.asarray(e.samples_ms, float)
    iqr = float(np.subtract(*np.percentile(samples, [75, 25]))) if len(samples) else math.nan
    return {"backend": e.backend, "status": e.status, "reason": e.reason, "err_ratio": e.err_ratio,
            "latency_ms": e.median, "iqr_ms": iqr, "n_samples": len(samples), "peak_mem_bytes": e.peak_mem_bytes,
            **e.checks, "deps": "torch" + (f" + {e.package}" if e.package else ""), "source": e.source, **values}


def _mib(n: float) -> str:
    return f"{n / 2 ** 20:.3g} MiB" if math.isfinite(n) else "unknown"


def _decider(winner: Evidence, runner_up: Evidence) -> str:
    """Which preference criterion put `winner` ahead of `runner_up` inside their tie."""
    a, b = preference(winner), preference(runner_up)
    if a[0] != b[0]:
        return f"lower peak memory ({_mib(winner.peak_mem_bytes)} vs {_mib(runner_up.peak_mem_bytes)})"
    if a[1] != b[1]:
        return f"a deterministic result ({runner_up.backend}'s is {runner_up.checks.get('deterministic', 'unknown')})"
    if a[2] != b[2]:
        return f"needing nothing beyond torch ({runner_up.backend} needs {runner_up.package})"
    return f"the lower median ({winner.median:.4g} vs {runner_up.median:.4g} ms)"


def explain(groups: list[list[Evidence]], fastest: Evidence | None, excluded: list[Evidence],
            cfg: CompareConfig = CompareConfig()) -> tuple[str | None, str]:
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
                                f"{nxt.backend} ({v['ratio']:.2f}x its median, p={v['p_value']:.2g})")
    verdicts = {e.backend: timing_verdict(fastest.samples_ms, e.samples_ms, cfg) for e in groups[0] if e is not fastest}

    def versus(e: Evidence) -> str:
        return "the fastest" if e is fastest else f"{e.median / fastest.median:.2f}x, {verdicts[e.backend]['verdict']}"

    others = ", ".join(f"{e.backend} ({versus(e)})" for e in groups[0] if e is not winner)
    text = (f"{winner.backend} ({versus(winner)}) is tied within noise with {others} (compare's rule: a difference "
            f"counts only when p < {cfg.alpha:g} and the medians differ by {cfg.min_effect:.0%} or more); among the "
            f"tied it is chosen " + ", ".join(f"over {e.backend} for {_decider(winner, e)}" for e in tied))
    if any(v["verdict"] == "inconclusive" for v in verdicts.values()):
        text += ("; 'inconclusive' ties are differences the samples were too noisy to confirm: rerun on a quieter "
                 "machine or with a larger --timing-budget-ms")
    return winner.backend, text


def _phase_status(rows: list[dict], training: bool) -> tuple[str, str, float]:
    """(status, reason, err_ratio) over the phases the workload uses: fwd, plus bwd when training."""
    by_phase = {r["phase"]: r for r in rows}
    phases = ("fwd", "bwd") if training else ("fwd",)
    errs = [float(by_phase[p].get("err_ratio", math.nan)) for p in phases]
    err = max((e for e in errs if math.isfinite(e)), default=math.nan)
    same = len({(by_phase[p]["status"], by_phase[p].get("reason", "")) for p in phases}) == 1
    for p in phases:
        if by_phase[p]["status"] != "pass":
            reason = by_phase[p].get("reason", "")
            return by_phase[p]["status"], reason if same else f"{p}: {reason}", err
    return "pass", "", err


def measure_now(case: AttentionCase, backends: list[Backend], device: torch.device, *, training: bool,
                seed: int = 0, timing: TimingConfig = TIMING) -> dict[str, Evidence]:
    """Correctness first (execute against the float64 reference), then timing and memory of the verified only."""
    prepared = prepare_case(case, device, seed)
    phase = "fwd+bwd" if training else "fwd"
    out = {}
    for backend in backends:
        verdict = execute(backend, prepared)
        status, reason, err = _phase_status(verdict.rows, training)
        e = Evidence(backend.name, status, reason, err, package=backend.package)
        if status == "pass":
            perf = measure_phase(backend, prepared, phase, verdict, config=timing, peaks={})
            if perf.measurement is None:  # oom or an error while timing
                e.status, e.reason = perf.row["status"], perf.row.get("reason", "")
            else:
                e.samples_ms, e.peak_mem_bytes = perf.measurement.samples_ms, float(perf.row["peak_mem_bytes"])
        out[backend.name] = e
    return out


def evidence_from_run(run_dir: str | Path, case: AttentionCase, phase: str, backends: list[Backend],
                      device: torch.device) -> tuple[dict[str, Evidence], str]:
    """Evidence a run directory holds for (case id, phase), from this machine's testbed only, and a note on what
    was used. A backend the run verified but did not time is left out (it is measured now)."""
    run_dir = Path(run_dir)
    results = load_results(run_dir)
    rows = results[(results.case_id == case.id) & (results.phase == phase)]
    if rows.empty:
        return {}, f"{run_dir}: {case.id} [{phase}] was not measured there; measured now"
    theirs, ours = run_testbed(run_dir, results), testbed_id(device)
    if theirs != ours:
        return {}, f"{run_dir}: testbed {theirs} is not this machine's ({ours}); measured now"
    samples = load_samples(run_dir)
    samples = samples[(samples.case_id == case.id) & (samples.phase == phase)]
    by_backend = {name: tuple(g.latency_ms.astype(float)) for name, g in samples.groupby("backend")}
    out = {}
    for backend in backends:
        match = rows[rows.backend == backend.name]
        if match.empty or (match.iloc[0].status == "pass" and not by_backend.get(backend.name)):
            continue
        r = match.iloc[0]
        out[backend.name] = Evidence(backend.name, str(r.status), "" if pd.isna(r.reason) else str(r.reason),
                                     float(r.err_ratio) if pd.notna(r.err_ratio) else math.nan,
                                     by_backend.get(backend.name, ()),
                                     float(r.peak_mem_bytes) if pd.notna(r.peak_mem_bytes) else math.nan,
                                     package=backend.package, source=f"run {run_dir.name}")
    return out, f"{run_dir}: used for {', '.join(out) or 'no backend'}"


def recommend_workload(workload: Workload, *, backends: str | list[str] | None = None, device: str | None = None,
                       results: str | Path | None = None, seed: int = 0, timing: TimingConfig = TIMING,
                       checks: bool = True, compile_backend: str = "inductor",
                       cfg: CompareConfig = CompareConfig()) -> pd.DataFrame:
    """The ranked table for one workload (see rank_backends); attrs add the workload, device and notes."""
    dev = resolve_device(device)
    chosen = get_backends(backends)
    case = workload.case()
    evidence, notes = {}, []
    if results is not None:
        found, note = evidence_from_run(results, case, workload.phase, chosen, dev)
        evidence.update(found)
        notes.append(note)
    missing = [b for b in chosen if b.name not in evidence]
    if missing:
        evidence.update(measure_now(case, missing, dev, training=workload.training, seed=seed, timing=timing))
    for backend in chosen:
        e = evidence[backend.name]
        if checks and e.eligible:  # checks run only for what could be recommended; the mask path is static
            e.checks = deployment_checks(backend, case, dev, training=workload.training, seed=seed,
                                         compile_backend=compile_backend)
        else:
            e.checks = mask_path(backend, case, dev)
    df = rank_backends([evidence[b.name] for b in chosen], cfg)
    df["case_id"], df["phase"] = case.id, workload.phase
    df.attrs.update(workload=workload.label, case_id=case.id, phase=workload.phase, device=str(dev),
                    device_name=device_name(dev), threads=torch.get_num_threads(), notes=notes,
                    check_case=check_case(case).id if checks else None)
    return df


def recommend(batch: int, heads: int, seq: int, head_dim: int, *, kv_heads: int | None = None,
              seq_k: int | None = None, dtype: str = "bf16", mask: str = "causal", training: bool = False,
              results: str | Path | None = None, backends: str | list[str] | None = None, device: str | None = None,
              seed: int = 0, timing: TimingConfig = TIMING, checks: bool = True,
              compile_backend: str = "inductor") -> pd.DataFrame:
    """Ranked backends for one shape on this machine: q (batch, heads, seq, head_dim), k/v (batch, kv_heads,
    seq_k, head_dim). One row per backend (COLUMNS); attrs hold the winner and why. See recommend_workload."""
    workload = Workload(batch, heads, seq, head_dim, kv_heads=kv_heads, seq_k=seq_k, dtype=dtype, mask=mask,
                        training=training)
    return recommend_workload(workload, backends=backends, device=device, results=results, seed=seed, timing=timing,
                              checks=checks, compile_backend=compile_backend)


def recommend_many(workloads: list[Workload], **kwargs) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """One table per workload (by label) and the overall table (see `overall`)."""
    tables = {w.label: recommend_workload(w, **kwargs) for w in workloads}
    return tables, overall(tables)


def _gmean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(values)))) if values else math.nan


def overall(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per backend over all workloads. The overall pick is ranked on every workload (verified and timed
    on each) with the best geometric-mean rank, then the lower geometric-mean latency over each one's fastest."""
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
        df.attrs.update(winner=best.backend, explanation=text)
    else:
        per = ", ".join(f"{label}: {t.attrs.get('winner')}" for label, t in tables.items())
        df.attrs.update(winner=None, explanation=f"no backend is verified and timed on every workload; per workload: "
                                                 f"{per}")
    return df
