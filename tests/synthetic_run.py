"""A small synthetic run directory (results.csv in the schema, samples.csv, env.json) for plot and report tests."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from harness.results import COLUMNS, SAMPLE_COLUMNS

PEAK = {"fp32": 1.0, "bf16": 1.5}
SEMANTICS = {"fully-masked-row:out": {"naive": "nan", "default": "0"},
             "causal-sq-ne-sk:fp32": {"default": "top-left"}}


def write_run(run_dir: Path, *, backends=("naive", "sdpa-flash", "flex", "xformers"), seqs=(128, 256, 512, 1024),
              dtypes=("fp32", "bf16"), masks=("none", "causal", "window"), perf: bool = True,
              semantics: bool = True, decode: bool = False) -> Path:
    """Rows for every case x backend x phase, shaped like a real run's. Planted, on the largest case of the last
    dtype: an sdpa-flash bwd failure (causal), a flex fwd error (causal) and a suspicious sdpa-flash timing (none).
    Always: flex has no backward (unsupported), xformers is unavailable, flex timings at 256 are noisy.
    With `decode`, each dtype also has one single-query case (seq_q = 1): a case with no length series."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rows, samples = [], []
    shapes = [(kind, n, n) for kind in masks for n in seqs] + ([("none", 1, max(seqs))] if decode else [])
    for dtype in dtypes:
        for kind, sq, n in shapes:
            planted = dtype == dtypes[-1] and n == max(seqs) and sq == n
            mask = f"window{n // 4}-0" if kind == "window" else kind  # real window ids carry their sizes
            case_id = f"{dtype}-b2-h4-s{sq}x{n}-d64-{mask}" if sq != n else f"{dtype}-b2-h4-s{n}-d64-{mask}"
            base = {"run_id": "synthetic", "case_id": case_id, "batch": 2, "heads": 4, "kv_heads": 4,
                    "seq_q": sq, "seq_k": n, "head_dim": 64, "dtype": dtype, "mask": mask, "device": "cpu",
                    "scale": 0.125, "schema_version": 1}
            for backend in backends:
                for phase in ("fwd", "bwd") + (("fwd+bwd",) if perf else ()):
                    verdict = _verdict(backend, phase, kind, n, planted)
                    timing = _perf(backend, phase, dtype, kind, n, planted) if perf and \
                        verdict["status"] == "pass" else {}  # only what passed is timed
                    rows.append(base | {"backend": backend, "phase": phase, **verdict, **timing})
                    if timing:
                        samples += [("synthetic", case_id, backend, phase, 0, i, timing["latency_ms"] * (1 + i / 100))
                                    for i in range(3)]
    if semantics:
        for question, answers in SEMANTICS.items():
            for backend in backends:
                rows.append({"run_id": "synthetic", "case_id": f"semantics:{question}", "backend": backend,
                             "phase": "fwd", "status": "observed",
                             "observed": answers.get(backend, answers["default"])})
    table = pd.DataFrame(rows).reindex(columns=list(COLUMNS))
    ints = ["batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim", "n_samples", "threads", "peak_mem_bytes"]
    table[ints] = table[ints].astype("Int64")  # written as '128', as the harness's csv writer does
    table.to_csv(run_dir / "results.csv", index=False)
    pd.DataFrame(samples, columns=list(SAMPLE_COLUMNS)).to_csv(run_dir / "samples.csv", index=False)
    env = {"device_name": "Synthetic CPU", "device_type": "cpu", "threads": 2, "torch": "2.13.0+cpu",
           "python": "3.11.7", "xformers": "0.0.35", "git_sha": "abc123", "run_id": "synthetic"}
    if perf:
        env |= {"timing_mode": "cpu-monotonic", "matmul_peak_tflops": PEAK}
    (run_dir / "env.json").write_text(json.dumps(env, indent=2))
    return run_dir


def _verdict(backend: str, phase: str, kind: str, n: int, planted: bool) -> dict:
    if phase == "fwd+bwd":  # as the benchmark stage writes it: carries the verdicts of both phases
        parts = [_verdict(backend, p, kind, n, planted) for p in ("fwd", "bwd")]
        bad = next((v for v in parts if v["status"] != "pass"), None)
        if bad:
            return {"status": bad["status"], "reason": f"not timed: {bad['status']}: {bad['reason']}"}
        return {"status": "pass", "err_ratio": max(v["err_ratio"] for v in parts)}
    if backend == "xformers":
        return {"status": "unavailable", "reason": "xformers kernels need CUDA; device is cpu"}
    if backend == "flex" and phase == "bwd":
        return {"status": "unsupported", "reason": "FlexAttention has no backward on CPU"}
    if backend == "flex" and kind == "causal" and planted and phase == "fwd":
        return {"status": "error", "reason": "RuntimeError: planted error"}
    if backend == "sdpa-flash" and kind == "causal" and planted and phase == "bwd":
        return {"status": "fail", "reason": "dq_err 0.3 > dq_tol 0.2", "err_ratio": 1.7}
    ratio = {"naive": 0.001, "sdpa-flash": 0.05, "flex": 0.08}.get(backend, 0.1) * (n / 128) ** 0.5
    return {"status": "pass", "err_ratio": ratio}


def _perf(backend: str, phase: str, dtype: str, kind: str, n: int, planted: bool) -> dict:
    scale = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[phase]
    speed = {"naive": 1.0, "sdpa-flash": 3.0 * (n / 128) ** 0.3, "flex": 1.5}.get(backend, 2.0)
    latency = scale * 0.5 * (n / 128) ** 2 / speed
    suspicious = backend == "sdpa-flash" and kind == "none" and planted and phase == "fwd"
    if suspicious:  # faster than the device's measured peak
        latency /= 8
    flops = scale * 4 * 2 * 4 * n * n * 64 * (0.5 if kind == "causal" else 1)
    tflops = flops / (latency * 1e-3) / 1e12
    # naive holds the (n x n) scores: O(n^2); the fused kernels O(n)
    memory = 8 * 4 * n * n * 4 if backend == "naive" else 8 * 4 * n * 64 * 4 * (2 if backend == "flex" else 1)
    return {"latency_ms": latency, "latency_iqr_ms": latency * 0.04, "latency_min_ms": latency * 0.97,
            "n_samples": 3, "timing_mode": "cpu-monotonic", "threads": 2,
            "noisy": backend == "flex" and n == 256, "suspicious": suspicious, "peak_mem_bytes": memory,
            "mem_method": "profiler", "flops": flops, "tflops": tflops, "pct_of_peak": 100 * tflops / PEAK[dtype],
            "compile_ms": 900.0 if backend == "flex" else None}
