"""Synthetic run dirs (results.csv, samples.csv, env.json in the real schema) for compare/history/merge tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from harness.results import ResultsWriter, SamplesWriter


def key(i: int, backend: str = "naive", phase: str = "fwd") -> tuple[str, str, str]:
    return (f"fp32-b2-h4-s{64 + i}-d32-none", backend, phase)


def write_run(run_dir: Path, rows: dict[tuple, dict], samples: dict[tuple, np.ndarray] | None = None, *,
              testbed: str = "tb-cpu-a", device_name: str = "Test CPU", host: str = "host-a",
              torch_version: str = "2.13.0", started: str = "2026-01-01T00:00:00+00:00", threads: int = 2) -> Path:
    """rows: key -> extra columns (status defaults to pass); samples: key -> latencies in ms, one array (one
    round) or a list of arrays (one per measurement round)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    writer = ResultsWriter(run_dir / "results.csv")
    out = []
    for (case_id, backend, phase), extra in rows.items():
        row = {"run_id": run_dir.name, "case_id": case_id, "backend": backend, "phase": phase, "status": "pass",
               "err_ratio": 0.1, "nonfinite": False, "device": "cpu", "device_name": device_name,
               "testbed_id": testbed, "torch_version": torch_version, **extra}
        if samples and (case_id, backend, phase) in samples:
            pooled = np.concatenate(_rounds(samples[(case_id, backend, phase)]))
            row.update(latency_ms=float(np.median(pooled)), n_samples=len(pooled), timing_mode="cpu-clock")
        out.append(row)
    writer.write(out)
    sw = SamplesWriter(run_dir / "samples.csv")
    for k, values in (samples or {}).items():
        for i, one_round in enumerate(_rounds(values)):
            sw.write(run_dir.name, *k, one_round, round_index=i)
    env = {"testbed_id": testbed, "device_name": device_name, "device_type": "cpu", "cpu_model": device_name,
           "threads": threads, "host": host, "torch": torch_version, "git_sha": "abc1234", "git_dirty": False,
           "started": started, "run_id": run_dir.name, "timing_mode": "cpu-clock"}
    (run_dir / "env.json").write_text(json.dumps(env))
    return run_dir


def _rounds(values) -> list[np.ndarray]:
    return list(values) if isinstance(values, list) else [values]


def lognormal(seed: int, n: int = 60, median_ms: float = 1.0, sigma: float = 0.05) -> np.ndarray:
    """Right-skewed latencies like real ones: a floor with a tail, median `median_ms`."""
    return median_ms * np.random.default_rng(seed).lognormal(0.0, sigma, n)
