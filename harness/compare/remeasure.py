"""`compare --remeasure`: re-time the new side's suspect keys (slower, undecided) until each is decided.

A regression must reproduce before the gate reports it, as Chromium's Pinpoint re-runs a suspected regression
and `asv continuous` re-measures before it reports a change. The new run's code is the checkout here, so its
keys can be timed again: in fresh worker processes each round (a process that ran slow stays out of the next),
the keys interleaved in a new order each round (a burst hits a few rounds of many keys, not every round of
one), with the new run's own timing budget per round. A re-measured key is judged on the base rounds against
the fresh rounds only - the first new rounds were the screen that made it suspect - after at least
`min_rounds` of them, and drops out as soon as it is decided. The time budget bounds the whole step.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

from harness.compare.gate import gate_verdict
from harness.compare.runs import Comparison, mark_regressions, samples_by_key
from harness.store.environment import git_state
from harness.store.run_dir import read_env
from harness.store.writer import SamplesWriter

REMEASURE_DIR = "remeasure"
SUSPECT = ("slower", "undecided")


@dataclass(frozen=True)
class RemeasureConfig:
    budget_s: float = 120.0
    min_rounds: int = 3
    max_rounds: int = 12
    seed: int = 0

    def __post_init__(self):
        if not (self.budget_s > 0 and 2 <= self.min_rounds <= self.max_rounds):
            raise ValueError(f"remeasure config {self}: needs budget_s > 0 and 2 <= min_rounds <= max_rounds")


def _run_cases(env: dict, run_dir: Path) -> dict:
    """The new run's cases by id, rebuilt from what its env.json says they came from."""
    from harness.spec.matrices import build_matrix
    from harness.spec.presets import get_preset, from_hf_config

    source = env.get("cases") or {}
    if source.get("preset"):
        cases = get_preset(source["preset"]).cases()
    elif source.get("hf_config"):
        cases = from_hf_config(source["hf_config"]).cases()
    elif source.get("matrix"):
        cases = build_matrix(source["matrix"])
    else:
        raise ValueError(f"{run_dir}/env.json does not say which cases the run had (written by an older harness); "
                         "re-run it to re-measure")
    return {c.id: c for c in cases}


def _check_same_code(env: dict, run_dir: Path) -> str:
    """Re-measuring times the code checked out here: it must be the new run's. Returns a note (dirty tree)."""
    sha, dirty = git_state()
    if env.get("git_sha") not in (None, "unknown") and sha != "unknown" and env.get("git_sha") != sha:
        raise ValueError(f"--remeasure times the code checked out here ({sha[:10]}), but the new run {run_dir} "
                         f"was {str(env.get('git_sha'))[:10]}: check it out, or re-run the new side")
    return "uncommitted changes in the checkout: they are what is re-measured" if dirty else ""


class ExecutorTimer:
    """Times keys of the new run here: fresh worker processes every round (closed at its end)."""

    def __init__(self, env: dict, out_dir: Path):
        from harness.backends.registry import load_backend_module
        from harness.execution.device import resolve_device
        from harness.measure.timing import TimingConfig

        for module in env.get("backend_modules") or []:
            load_backend_module(module)
        self.device = resolve_device(env.get("device") or "auto")
        timing = env.get("round_timing")
        self.config = TimingConfig(**timing) if timing else TimingConfig().share(int(env.get("rounds") or 1))
        self.seed, self.log_dir, self.executor = int(env.get("seed") or 0), str(out_dir / "workers"), None

    def start_round(self) -> None:
        from harness.execution.isolation import IsolatedExecutor

        self.executor = IsolatedExecutor(self.device, log_dir=self.log_dir)

    def time(self, case, backend, phase: str, estimate_ms: float) -> tuple[float, ...] | str:
        """One round of one key: its samples (ms), or why timing failed."""
        from harness.execution.call import Call
        from harness.execution.timed import TimingCall

        answer = self.executor.time(backend, TimingCall(Call(case, self.seed), phase, self.config,
                                                        estimate_ms=estimate_ms), self.device)
        return answer.failure.reason if answer.measurement is None else answer.measurement.samples_ms

    def end_round(self) -> None:
        self.executor.close()


def remeasure(comparison: Comparison, config: RemeasureConfig = RemeasureConfig(), *, log=print,
              timer=None, cases: dict | None = None, clock=time.monotonic) -> Comparison:
    """Re-time the suspect keys of `comparison`'s new run here; their rows are re-decided on the fresh rounds
    (columns `remeasured`, `first_verdict`, `rounds_new` and the note say so). Fresh samples go to
    <new run>/remeasure/samples.csv. `timer` (default ExecutorTimer), `cases` (id -> case; default: rebuilt from
    the run's env.json) and `clock` are for tests."""
    from harness.backends.registry import get_backends

    if comparison.mode != "gate":
        raise ValueError("--remeasure needs a gate (both runs on one testbed), not a cross-device report")
    rows = comparison.rows
    suspects = rows[rows.verdict.isin(SUSPECT) & (rows.n_base > 0)]
    if suspects.empty:
        return comparison
    new_dir = comparison.new.run_dir
    env = read_env(new_dir)
    out_dir = new_dir / REMEASURE_DIR
    out_dir.mkdir(exist_ok=True)
    dirty_note = "" if timer is not None else _check_same_code(env, new_dir)
    cases = _run_cases(env, new_dir) if cases is None else cases
    timer = timer if timer is not None else ExecutorTimer(env, out_dir)
    base_samples = samples_by_key(comparison.base.run_dir)

    pending = {}
    for row in suspects.itertuples():
        case = cases.get(row.case_id)
        if case is None:
            rows.loc[row.Index, "note"] = f"{row.note}; not re-measured: case not in the run's matrix".lstrip("; ")
            continue
        pending[row.Index] = (case, get_backends([row.backend])[0], row.phase, float(row.new_ms))
        rows.loc[row.Index, "first_verdict"] = row.verdict
    writer = SamplesWriter(out_dir / "samples.csv")
    fresh: dict[int, tuple[list[float], list[int]]] = {i: ([], []) for i in pending}
    order = random.Random(config.seed)
    start, rounds_done = clock(), 0
    log(f"re-measuring {len(pending)} key(s) of {new_dir} (budget {config.budget_s:.0f} s)"
        + (f"; {dirty_note}" if dirty_note else ""))
    while pending and rounds_done < config.max_rounds and clock() - start < config.budget_s:
        timer.start_round()
        try:
            keys = list(pending)
            order.shuffle(keys)  # a new order every round: a burst hits different keys' rounds
            for i in keys:
                if clock() - start >= config.budget_s:
                    break
                case, backend, phase, estimate = pending[i]
                samples = timer.time(case, backend, phase, estimate)
                if isinstance(samples, str):
                    rows.loc[i, "note"] = f"re-measure failed: {samples}"
                    del pending[i]
                    continue
                fresh[i][0].extend(samples)
                fresh[i][1].extend([rounds_done] * len(samples))
                writer.write(env.get("run_id", new_dir.name), case.id, backend.name, phase, samples, rounds_done)
        finally:
            timer.end_round()
        rounds_done += 1
        for i in list(pending):
            if len(set(fresh[i][1])) >= config.min_rounds and _decide(comparison, i, base_samples, fresh[i]) \
                    in ("slower", "unchanged", "faster"):
                del pending[i]
    for i in pending:
        if fresh[i][0]:
            _decide(comparison, i, base_samples, fresh[i])  # what the fresh rounds say when the budget ended
    log(f"re-measured in {clock() - start:.0f} s, {rounds_done} round(s); "
        + (f"{len(pending)} key(s) still undecided" if pending else "every key decided"))
    mark_regressions(comparison)
    return comparison


def _decide(comparison: Comparison, index: int, base_samples: dict, fresh: tuple[list[float], list[int]]) -> str:
    """Re-decide one row on the base rounds against the fresh ones; returns the verdict."""
    rows = comparison.rows
    row = rows.loc[index]
    key = (row.case_id, row.backend, row.phase)
    b_ms, b_rounds = base_samples.get(key, ([], []))
    noise = None if comparison.noise is None else comparison.noise.key(key)
    verdict = gate_verdict(b_ms, fresh[0], comparison.config, base_rounds=b_rounds, new_rounds=fresh[1], noise=noise)
    for column, value in verdict.columns().items():
        rows.loc[index, column] = value
    rows.loc[index, "verdict"] = verdict.verdict
    rows.loc[index, "remeasured"] = True
    rows.loc[index, "note"] = (f"re-measured: {verdict.rounds_new} fresh rounds (first verdict {row.first_verdict})"
                               + (f"; {verdict.note}" if verdict.note else ""))
    return verdict.verdict
