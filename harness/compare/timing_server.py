"""The base side of a paired re-measurement: times a run's keys with this checkout's code, JSON lines on stdio."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def serve(run_dir: Path, log_dir: Path, fresh_workers: bool, requests, answer) -> None:
    """Answer {"ready": true, "note"} or {"refused": why}, then per request line: {"op": "start_round"},
    {"op": "time", "case", "backend", "phase", "estimate_ms"} -> {"samples": [...], "contention"}, {"rejected": why},
    {"unaudited": why} or {"failure": why}, {"op": "end_round"}, {"op": "close"}."""
    from harness.compare.timers import ExecutorTimer, Rejected, Unaudited, code_mismatch, current_code, run_cases
    from harness.store.schema import REJECTED
    from harness.store.run_dir import read_env

    env = read_env(run_dir)
    why = code_mismatch(env, current_code(), allow_dirty=True)
    if why:
        answer({"refused": f"this checkout is not the code of {run_dir}: {why}"})
        return
    try:
        cases = run_cases(env, run_dir)
        timer = ExecutorTimer(env, log_dir, fresh_workers, run_dir=run_dir)
    except ValueError as exc:
        answer({"refused": str(exc)})
        return
    answer({"ready": True, "note": "uncommitted changes there" if current_code()["git_dirty"] else ""})
    try:
        for line in requests:
            request = json.loads(line)
            op = request.get("op")
            if op == "close":
                break
            if op == "start_round":
                timer.start_round()
                answer({"ok": True})
            elif op == "end_round":
                timer.end_round()
                answer({"ok": True})
            elif op == "time":
                case = cases.get(request["case"])
                got = (f"case {request['case']!r} is not in {run_dir}'s matrix" if case is None else
                       timer.time(case, request["backend"], request["phase"], float(request["estimate_ms"])))
                answer({"failure": got} if isinstance(got, str) else {REJECTED: got.reason}
                       if isinstance(got, Rejected) else {"unaudited": got.reason} if isinstance(got, Unaudited)
                       else {"samples": list(got.samples), "contention": got.contention})
            else:
                answer({"failure": f"unknown op {op!r}: expected start_round, time, end_round or close"})
    finally:
        timer.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--log-dir", type=Path, default=None, help="worker logs (default: RUN_DIR/remeasure)")
    parser.add_argument("--fresh-workers", action="store_true")
    args = parser.parse_args(argv)
    # the protocol owns the real stdout; anything a library prints goes to stderr (the caller's log file)
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def answer(obj: dict) -> None:
        protocol.write(json.dumps(obj) + "\n")
        protocol.flush()

    log_dir = args.log_dir or args.run_dir / "remeasure"
    log_dir.mkdir(parents=True, exist_ok=True)
    serve(args.run_dir, log_dir, args.fresh_workers, sys.stdin, answer)


if __name__ == "__main__":
    main()
