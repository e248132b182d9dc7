"""Python entry point: harness.check(backends, cases, device) -> DataFrame, the same verdicts as the suites."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd

from harness.backends.base import Backend
from harness.backends.registry import get_backends
from harness.calls.caller import left_as_found
from harness.calls.device import resolve_device
from harness.isolation.executor import make_executor
from harness.run.session import RunSession
from harness.cases.case import AttentionCase
from harness.cases.matrices import build_matrix, resolve_matrix
from harness.cases.presets import quick_cases
from harness.store.schema import COLUMNS, Row


def check(backends: Iterable[str | Backend] | str | None = None, cases: Iterable[AttentionCase] | str = "smoke",
          device: str | None = None, *, results_path: str | Path | None = None, seed: int = 0,
          run_id: str = "", isolate: bool = False, call_timeout_s: float | None = None, preset: str | None = None,
          hf_config: str | Path | None = None, batch: int | None = None, seq: int | None = None) -> pd.DataFrame:
    """Check each backend on each case against the float64 reference; one row per (case, backend, phase).

    `cases` is a list of AttentionCase or a matrix name; `backends` names, Backend objects or None for all. With
    `preset` (a name of cases/presets.PRESETS) or `hf_config` (a local config.json), the cases are instead small
    ones of that model's attention shape (ModelShape.quick_cases, sized by `batch` and `seq` when given).
    With `results_path`, rows are also appended to that CSV as each case finishes. With `isolate`, every backend
    runs in a supervised worker process (a crash or a call over `call_timeout_s` becomes an error row); its
    backends must then be registered from an importable module, and a script needs the usual
    `if __name__ == "__main__":` guard of multiprocessing. A backend of a module loaded with
    `harness.load_backend_module` always runs in its own workers (its code never runs in this process); the others
    run here without `isolate`, and `.attrs["integrity"]` of the result says "in-process, unguarded".
    """
    dev = resolve_device(device)
    case_list = quick_cases(preset, hf_config, batch=batch, seq=seq)
    if case_list is None:
        case_list = build_matrix(resolve_matrix(cases, dev.type)) if isinstance(cases, str) else list(cases)
    for c in case_list:
        if not isinstance(c, AttentionCase):
            raise ValueError(f"cases must be AttentionCase objects or a matrix name; got {c!r}")
    if backends is None or isinstance(backends, str):
        chosen = get_backends(backends)
    else:
        chosen = [b if isinstance(b, Backend) else get_backends([b])[0] for b in backends]
    # a fresh in-process executor per call: what it remembers (a KeyboardInterrupt inside a backend, which stops
    # this call after writing its row) must not stop the next call in the same process
    executor = make_executor(dev, isolate=isolate, timeout_s=call_timeout_s,
                             log_dir=str(Path(results_path).parent / "workers") if results_path else None)
    with left_as_found():  # the caller's process: torch's settings and the stage clock put back
        # a session without a run folder: rows go to results_path alone, when given
        session = RunSession(dev, None, seed, run_id=run_id, executor=executor, results_path=results_path)
        frame = check_in_session(session, chosen, case_list)
    frame.attrs["integrity"] = executor.integrity  # where the backends' code ran: in-process, unguarded by default
    return frame


def check_in_session(session: RunSession, backends: Iterable[Backend], cases: Iterable[AttentionCase]) -> pd.DataFrame:
    """`check`'s work in a session the caller built (`python -m harness check`: RunSession.from_options, with its
    run folder): every backend on every case, case-major, rows written as each finishes; the session is finished
    at the end. A KeyboardInterrupt inside a backend stops it once that row is written."""
    rows: list[Row] = []
    complete = False
    backends, cases = list(backends), list(cases)
    session.compile_ahead([(c, b) for c in cases for b in backends])  # flex's graphs on the second core
    try:
        for case in cases:
            for backend in backends:
                rows.extend(session.check(case, backend).rows)
                if session.executor.interrupted:
                    raise KeyboardInterrupt(f"{session.executor.interrupted}; the rows so far are written")
        complete = True
    finally:
        session.finish(complete=complete)
    return pd.DataFrame([r.as_dict() for r in rows]).reindex(columns=[c for c in COLUMNS if c != "schema_version"])
