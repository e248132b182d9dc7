"""Whether a run reached its end (env.json's `status` and `stage`), and the notes every reader of a run adds."""

from __future__ import annotations

#: env.json `status`: written RUNNING when the run folder is made, COMPLETE when the run reached its end, INTERRUPTED
#: when it ended early but could still write (Ctrl-C, a backend's KeyboardInterrupt). A run killed (kill -9, out of
#: memory, a lost node) keeps RUNNING and the stage it was in: that is how a reader knows it did not finish.
RUNNING, COMPLETE, INTERRUPTED = "running", "complete", "interrupted"
#: env.json `stage` before the first stage starts (peaks measured, workers started)
START = "start"


def incomplete(env: dict) -> str | None:
    """Why the run described by `env` (its env.json) did not reach its end, in a phrase ('stopped during the
    correctness stage (killed or crashed: no end recorded)'), or None when it did or `env` is empty."""
    status, stage = env.get("status"), env.get("stage")
    where = f" during the {stage} stage" if stage and stage != START else " before its first stage" if stage else ""
    if status == RUNNING:
        return f"stopped{where} (killed or crashed: no end recorded)"
    if status == INTERRUPTED:
        return f"interrupted{where}"
    # an env.json from before the status was recorded: a start but no `time_spent` (written at the end)
    if status is None and env.get("started") and "time_spent" not in env and "shards" not in env:
        return "stopped before its end (no end recorded)"
    return None


def benchmark_planned(env: dict) -> bool:
    """Whether the run was to time its cases (--benchmark), as far as env.json tells."""
    return bool(env.get("benchmark") or env.get("timing_config") or env.get("matmul_peak_tflops"))


def run_notes(env: dict, refused: dict[str, int] | None = None) -> list[str]:
    """What a reader of this run must know before its figures: it did not finish, lines of its files were
    refused ({file name: count})."""
    why = incomplete(env)
    notes = [f"incomplete run: {why}; it holds only the rows written until then"] if why else []
    return notes + [f"{count} line(s) of {file} refused as unreadable (damaged or cut short; the warning lists them)"
                    for file, count in (refused or {}).items() if count]
