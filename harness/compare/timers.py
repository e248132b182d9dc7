"""The timers of a re-measurement: this checkout's code in workers, or another checkout's through its server; which
code and kernel sources each side runs."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from harness.calls.cache import pool_cache
from harness.store.environment import REPO_ROOT, git_state, library_versions
from harness.store.kernels import describe, timed_module
from harness.store.schema import REJECTED


@dataclass(frozen=True)
class Timed:
    """One key's round: its samples (ms) and the share of the CPUs other processes took meanwhile (Row.contention,
    read by the run's process; None where it was not: no /proc, or a base checkout's server that does not send it)."""

    samples: tuple[float, ...]
    contention: float | None = None


@dataclass(frozen=True)
class Rejected:
    """A re-measured round that failed an integrity check (docs/integrity.md): `reason` names the check and call."""

    reason: str


@dataclass(frozen=True)
class Unaudited:
    """A re-measured round the machine's load left unauditable (run/audit.py Audit.loaded): no figure, no verdict;
    the pair does not count, as a saturated one does not."""

    reason: str


class KeyTimer(Protocol):
    """Times keys of one run with one checkout's code, one round at a time."""

    def start_round(self) -> None: ...

    def time(self, case, backend: str, phase: str, estimate_ms: float) -> Timed | Rejected | str: ...

    def end_round(self) -> None: ...

    def close(self) -> None: ...


def run_cases(env: dict, run_dir: Path) -> dict:
    """A run's cases by id, rebuilt from what its env.json says they came from."""
    from harness.cases.case import AttentionCase
    from harness.cases.matrices import build_matrix
    from harness.cases.presets import from_hf_config, get_preset

    source = env.get("cases") or {}
    for field, make in (("preset", lambda v: get_preset(v).cases()), ("hf_config", lambda v: from_hf_config(v).cases()),
                        ("matrix", build_matrix), ("case_ids", lambda v: [AttentionCase.from_id(i) for i in v])):
        if source.get(field):
            return {c.id: c for c in make(source[field])}
    raise ValueError(f"{run_dir}/env.json does not say which cases the run had (written by an older harness); "
                     "re-run it to re-measure")


def current_code() -> dict:
    """The commit and library versions of this process, under env.json's names."""
    sha, dirty = git_state()
    return {"git_sha": sha, "git_dirty": dirty, **library_versions()}


def code_mismatch(env: dict, here: dict, *, allow_dirty: bool) -> str | None:
    """Why the code `here` is not the code that made the run of `env` (None: it is, as far as can be told)."""
    # what must be the same between a run and the code that times its keys again (a torch upgrade is a change)
    diffs = [f"{f} {env.get(f)!r} here {here.get(f)!r}" for f in ("git_sha", *library_versions())
             if env.get(f) not in (None, "unknown") and here.get(f) != env.get(f)]
    if diffs:
        return "the run had " + ", ".join(diffs)
    if not allow_dirty and (env.get("git_dirty") or here.get("git_dirty")):
        return "uncommitted changes (in the run's checkout or here): the same commit is not the same code"
    return None


class ExecutorTimer:
    """Times keys of a run with this process's code in workers, each round judged as a suite run's is."""

    def __init__(self, env: dict, log_dir: Path, fresh_workers: bool = False, run_dir: Path | None = None):
        from harness.isolation.plugin_host import load_backend_module
        from harness.calls.device import resolve_device
        from harness.measure.timing import TimingConfig

        kept = env.get("backend_sources") if run_dir is not None else None
        # the kernels the run timed: its own copies (store/kernels.py); an older run's modules where they lie
        for module in ([timed_module(r, Path(run_dir)) for r in kept] if kept else
                       [_here(m, env.get("checkout")) for m in env.get("backend_modules") or []]):
            load_backend_module(module)
        self.device = resolve_device(env.get("device") or "auto")
        timing = env.get("round_timing")
        self.config = TimingConfig(**timing) if timing else TimingConfig().share(int(env.get("rounds") or 1))
        self.seed, self.threads = int(env.get("seed") or 0), env.get("threads")
        self.log_dir, self.fresh, self.executor = str(log_dir), fresh_workers, None
        self.prepared: dict[str, object] = {}
        self.pools = pool_cache()  # the timed contents' pools this process makes again to judge

    def start_round(self) -> None:
        from harness.isolation.executor import make_executor

        if self.executor is None:
            self.executor = make_executor(self.device, isolate=True, threads=self.threads, log_dir=self.log_dir)

    def time(self, case, backend: str, phase: str, estimate_ms: float) -> Timed | Rejected | Unaudited | str:
        """One round of one key: its samples (ms), Rejected (a check failed: no figure), Unaudited (the load left
        its clock unauditable: no figure), or why timing failed."""
        from harness.backends.registry import get_backends
        from harness.run.judge import judge_timed
        from harness.calls.call import Call
        from harness.run.audit import audited_time
        from harness.run.runner import prepare_case
        from harness.calls.timed import TimingCall

        try:
            (impl,) = get_backends([backend])
        except ValueError as exc:
            return str(exc)
        # the memory was measured in the run; known_memory skips the probe (an extra call per round)
        timing = TimingCall(Call(case, self.seed), phase, self.config, estimate_ms=estimate_ms,
                            known_memory=(0, "not measured"))
        answer, clock = audited_time(self.executor, impl, timing, self.device)
        if answer.measurement is None:
            return answer.failure.reason
        if case.id not in self.prepared:  # the answer every round of every key of the case is judged against
            self.prepared[case.id] = prepare_case(case, self.device, self.seed)
        # a round the machine's load left unauditable is still judged (benchmark.py's rule); then it has no samples
        problem = ((not clock.loaded and clock.problem)
                   or judge_timed(impl.name, self.prepared[case.id], phase, answer.observed, answer.seed,
                                  answer.witness, self.pools) or answer.integrity)
        if problem:
            return Rejected(f"timed at median {answer.measurement.median:.4g} ms, but {problem}")
        if clock.loaded:
            return Unaudited(clock.problem)
        return Timed(tuple(answer.measurement.samples_ms), answer.others_share)

    def end_round(self) -> None:
        if self.fresh:
            self.close()

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
            self.executor = None


def _here(module: str, checkout: str | None) -> str:
    """A run's plugin module path, moved into this checkout when it lay inside the run's checkout."""
    if checkout and module.endswith(".py"):
        try:
            return str(REPO_ROOT / Path(module).relative_to(checkout))
        except ValueError:
            pass
    return module


class CheckoutTimer:
    """Times keys of a run with another checkout's code: harness.compare.timing_server started there."""

    def __init__(self, checkout: Path, run_dir: Path, log_dir: Path, python: str | None = None,
                 fresh_workers: bool = False):
        import os

        # absolute: the server's working directory is the checkout, not ours
        checkout, run_dir, log_dir = (Path(p).resolve() for p in (checkout, run_dir, log_dir))
        if not (checkout / "harness" / "compare").is_dir():
            raise ValueError(f"--base-checkout {checkout}: not a checkout of this project (no harness/compare/)")
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stderr = log_dir / "timing-server.log"
        cmd = [python or sys.executable, "-m", "harness.compare.timing_server", str(run_dir),
               "--log-dir", str(log_dir)] + (["--fresh-workers"] if fresh_workers else [])
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        with self.stderr.open("w") as err:
            self.proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, text=True)
        hello = self._read(f"starting the base side's timing server in {checkout}")
        if "refused" in hello:
            self.close()
            raise ValueError(f"--base-checkout {checkout}: {hello['refused']}")
        self.note = hello.get("note", "")

    def _read(self, doing: str) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            tail = self.stderr.read_text()[-1500:] if self.stderr.exists() else ""
            raise RuntimeError(f"the base side's timing server died while {doing}: {tail}")
        return json.loads(line)

    def _ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read(f"answering {request['op']}")

    def start_round(self) -> None:
        self._ask({"op": "start_round"})

    def time(self, case, backend: str, phase: str, estimate_ms: float) -> Timed | Rejected | Unaudited | str:
        answer = self._ask({"op": "time", "case": case.id, "backend": backend, "phase": phase,
                            "estimate_ms": estimate_ms})
        # an older checkout's server sends no contention: its pairs are counted as before
        return (Timed(tuple(answer["samples"]), answer.get("contention")) if "samples" in answer else
                Rejected(answer[REJECTED]) if REJECTED in answer else
                Unaudited(answer["unaudited"]) if "unaudited" in answer else str(answer.get("failure")))

    def end_round(self) -> None:
        self._ask({"op": "end_round"})

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "close"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


def kernels_differ(base_env: dict, new_env: dict) -> bool:
    """Whether the two runs timed different kernel sources (a plugin changed between them)."""
    digests = [[r.get("sha256") for r in env.get("backend_sources") or []] for env in (base_env, new_env)]
    return digests[0] != digests[1]


def sources_note(base_env: dict, new_env: dict) -> str:
    """Which kernel source each side of a re-measurement ran ('' for a run of built-ins only)."""
    base, new = (env.get("backend_sources") or [] for env in (base_env, new_env))
    if not base and not new:
        return ""
    if not kernels_differ(base_env, new_env):
        return "kernel source unchanged: " + ", ".join(describe(r) for r in new)
    return (f"kernel sources: base {', '.join(describe(r) for r in base) or 'none'}, new "
            f"{', '.join(describe(r) for r in new) or 'none'}")
