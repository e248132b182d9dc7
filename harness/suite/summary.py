"""The harness's summary at the end of `pytest suites`: per backend its cases by verdict, rejected keys and median
speedup over naive, then a line for keys timed beside other load and for known cheats."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

from harness.oracle.signatures import signature
from harness.run.session import RunSession
from harness.store.schema import (BASELINE, FAILING, LOADED_SHARE, OBSERVED, PHASES, REJECTED, STATUSES,
                                  figures_comparable, loaded)

SPEEDUP = "speedup vs naive"
LEGEND = ("cases by verdict: the matrix's cases, each under its worst phase (pass: out, dq, dk, dv within tolerance "
          "of the float64 reference), as the report's headline counts them; the probes' cases (edge:, ...) are "
          "counted apart there")
SPEEDUP_LEGEND = ("; speedup vs naive: naive's median latency / the backend's, median over cases (2.00 = twice as "
                  "fast; a figure beyond the measured peak, suspicious, counts in none)")
REJECTED_LEGEND = ("; rejected: timed keys (case, phase) whose calls failed an integrity check: no figure is kept "
                   "(docs/integrity.md)")


def summary_lines(session: RunSession) -> list[str]:
    """Per backend: cases by correctness status and, when timed, the timed keys rejected by the integrity checks and
    the median speedup over naive per phase; then a line per backend with a rejection, naming the check."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for (_, backend), result in session.verdicts.items():
        counts[backend][result.status] += 1
    speedups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    rejected: dict[str, list] = defaultdict(list)
    for (case_id, backend, phase), row in session.perf_rows.items():
        if row.timing_status == REJECTED:
            rejected[backend].append(row)
        naive = session.perf_rows.get((case_id, BASELINE, phase))
        usable = (naive is not None and figures_comparable(row.timing_status, row.suspicious)
                  and figures_comparable(naive.timing_status, naive.suspicious))
        if usable and row.latency_ms and naive.latency_ms:
            speedups[backend][phase].append(naive.latency_ms / row.latency_ms)
    statuses = [s for s in STATUSES if s != OBSERVED]  # observed: a probe's finding, not a verdict
    width = max(16, *map(len, counts))
    header = f"{'backend':<{width}}" + "".join(f"{s:>{len(s) + 2}}" for s in statuses)
    if session.perf_rows:
        header += f"{REJECTED:>{len(REJECTED) + 2}}" + "".join(f"  {SPEEDUP} {p}" for p in PHASES)
    lines = [header]
    for backend, c in counts.items():
        line = f"{backend:<{width}}" + "".join(f"{c.get(s, 0):>{len(s) + 2}}" for s in statuses)
        if session.perf_rows:
            medians = [f"{statistics.median(s):.2f}" if (s := speedups[backend][p]) else "-" for p in PHASES]
            line += f"{len(rejected.get(backend, ())):>{len(REJECTED) + 2}}"
            line += "".join(f"{m:>{len(SPEEDUP) + len(p) + 3}}" for m, p in zip(medians, PHASES))
        lines.append(line)
    lines.append(LEGEND + (SPEEDUP_LEGEND + REJECTED_LEGEND if session.perf_rows else ""))
    for backend, rows in rejected.items():
        first = rows[0]
        lines.append(f"{REJECTED} {backend}: {len(rows)} timed key(s) refused by the integrity checks, e.g. "
                     f"{first.case_id} [{first.phase}]: {first.timing_reason}")
    return lines + loaded_lines(session.perf_rows.values()) + cheat_lines(session)


#: what --threads 1 did for a run beside other load (issue 67 item 3; docs/timing.md "Beside other load"): the smoke
#: matrix's naive keys on this 2-core VM at load average 8.5, 2 threads then 1, back to back on 2026-12-07
THREADS_REMEDY = ("with more than one thread a call waits for any of its threads the machine deschedules: beside six "
                  "busy processes on 2 CPUs, --threads 1 took the smoke matrix's keys from rounds 4.6x apart (the "
                  "median key; 23 % of rounds over 4x the key's best) to 1.12x apart (none), and the run from 218 s "
                  "to 115 s")


def loaded_lines(rows) -> list[str]:
    """A line when keys were timed beside other load (schema.loaded: their `contention` over LOADED_SHARE): how many,
    and the remedies - a quieter machine, and --threads 1 where the keys ran on several threads (THREADS_REMEDY,
    measured); none on a quiet run."""
    shares = [r.contention for r in rows if r.contention is not None]
    busy = [s for s in shares if loaded(s)]
    if not busy:
        return []
    threads = max((r.threads or 1 for r in rows if r.contention is not None and loaded(r.contention)), default=1)
    return [f"loaded: {len(busy)} of {len(shares)} timed key(s) ran while other processes took over "
            f"{LOADED_SHARE:.0%} of the CPUs (at most {max(busy):.0%}; results.csv's contention column has each "
            "key's): their figures carry that load - time them again on a quiet machine before trusting a speedup"
            + (f"; or run with --threads 1 ({THREADS_REMEDY})" if threads > 1 else "")]


def cheat_lines(session: RunSession) -> list[str]:
    """A line per backend and known cheat its failures or rejected timings show (oracle/signatures.py), in plain
    words, with how many rows and one of them."""
    seen: dict[tuple[str, str], list] = defaultdict(list)
    rows = [(r, r.reason) for result in session.verdicts.values() for r in getattr(result, "rows", ())
            if r.status in FAILING] + [(r, r.timing_reason) for r in session.perf_rows.values()
                                       if r.timing_status == REJECTED]
    for row, reason in rows:
        if words := signature(reason):
            seen[(row.backend, words)].append(row)
    return [f"looks like a known cheat: {backend}: {words} ({len(found)} row(s), e.g. {found[0].case_id} "
            f"[{found[0].phase}])" for (backend, words), found in seen.items()]
