"""Merge the run dirs of shards (one per GPU or Slurm task) into one run dir: no row lost, none duplicated."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import pandas as pd

from harness.store.load import load_results, load_samples
from harness.store.run_dir import RESULTS, SAMPLES, is_run_dir, read_env, write_env
from harness.store.schema import COLUMNS, KEY, SAMPLE_COLUMNS, SCHEMA_VERSION

SHARDS_DIR = "shards"
#: pytest exit codes of a shard that ran to its end: all passed, some tests failed, no case fell in the shard
COMPLETE = (0, 1, 5)


class ShardFailed(RuntimeError):
    """A shard did not run to its end (or has not yet); its rows stay in its own run dir, nothing was merged."""


def shard_root(run_dir: str | Path, index: int, count: int) -> Path:
    """Where shard `index` of `count` writes its own run dir (passed to it as --results-dir)."""
    return Path(run_dir) / SHARDS_DIR / f"shard-{index:0{len(str(count - 1))}d}"


def write_exit_status(root: str | Path, returncode: int) -> None:
    """Record that shard `root` finished, with pytest's exit code: a merge trusts only finished shards."""
    Path(root).with_suffix(".exit").write_text(f"{returncode}\n")


def check_finished(roots: Sequence[Path]) -> None:
    """Raise ShardFailed naming every shard that has no exit status yet or that did not complete."""
    problems = []
    for i, root in enumerate(roots):
        status = root.with_suffix(".exit")
        if not status.exists():
            problems.append(f"shard {i}/{len(roots)} has not finished (no {status.name})")
            continue
        rc = int(status.read_text().strip() or -1)
        if rc not in COMPLETE:  # with the last lines of its log
            log = root.with_suffix(".log")
            tail = log.read_text(errors="replace").strip().splitlines()[-5:] if log.exists() else []
            problems.append(f"shard {i}/{len(roots)} exited {rc} (log {log}):\n    " + "\n    ".join(tail))
    if problems:
        raise ShardFailed(f"{len(problems)} of {len(roots)} shards unfinished or failed; not merged (shard runs kept "
                          f"under {roots[0].parent}):\n" + "\n".join(problems))


def shard_run_dir(root: str | Path) -> Path:
    """The one run dir a shard's pytest created under its --results-dir."""
    runs = [p for p in Path(root).iterdir() if is_run_dir(p)] if Path(root).is_dir() else []
    if len(runs) != 1:
        raise ValueError(f"shard directory {str(root)!r} holds {len(runs)} run dirs {[p.name for p in runs]}; "
                         "expected exactly 1 (did the shard start, or was it run twice?)")
    return runs[0]


def _write_atomic(df: pd.DataFrame, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    df.to_csv(tmp, index=False)
    os.replace(tmp, path)  # a reader never sees half a file


def _merge_env(envs: list[dict], shard_dirs: list[Path], rows: list[int], run_id: str, testbed_id: str) -> dict:
    """Fields equal in every shard once at the top; what differs (device, host, clocks, start) per shard."""
    keys = list(dict.fromkeys(k for env in envs for k in env))
    common = {k: envs[0].get(k) for k in keys if all(env.get(k) == envs[0].get(k) for env in envs)}
    shards = [{"shard_dir": str(d), "rows": n, **{k: env.get(k) for k in keys if k not in common}}
              for d, env, n in zip(shard_dirs, envs, rows)]
    return {**common, "run_id": run_id, "testbed_id": testbed_id, "shards": shards}


def merge_runs(shard_dirs: Sequence[str | Path], out_dir: str | Path, *,
               allow_mixed_testbeds: bool = False) -> pd.DataFrame:
    """Concatenate the shards' results.csv and samples.csv into out_dir (run id = its name), merge env.json, and
    return the merged results read back. Refuses an out_dir that holds results, a key in two shards, and shards
    of different testbeds unless allow_mixed_testbeds (the testbed id is then their '+'-joined ids)."""
    shard_dirs = [Path(d) for d in shard_dirs]
    out_dir = Path(out_dir)
    if is_run_dir(out_dir):
        raise ValueError(f"{out_dir}/{RESULTS} already exists; merge into a new run directory")
    run_id = out_dir.name
    results = [load_results(d) for d in shard_dirs]
    samples = [load_samples(d) for d in shard_dirs]
    envs = [read_env(d) for d in shard_dirs]
    keyed = pd.concat([r[list(KEY)].assign(_shard=str(d)) for r, d in zip(results, shard_dirs)], ignore_index=True)
    dup = keyed[keyed.duplicated(list(KEY), keep=False)]
    if not dup.empty:
        examples = dup.groupby(list(KEY))._shard.apply(list).head(5)
        raise ValueError(f"{dup[list(KEY)].drop_duplicates().shape[0]} key(s) appear in more than one shard, e.g. "
                         + "; ".join(f"{k} in {v}" for k, v in examples.items()) + " (overlapping shards?)")
    testbeds = sorted({str(env.get("testbed_id")) for env in envs if env.get("testbed_id")}
                      | {str(t) for r in results for t in r.get("testbed_id", pd.Series(dtype=str)).dropna()})
    if len(testbeds) > 1 and not allow_mixed_testbeds:
        raise ValueError(f"shards come from {len(testbeds)} testbeds {testbeds}; merging them makes one run whose "
                         "timings compare with nothing. Run one job per GPU type, or pass allow_mixed_testbeds")
    testbed_id = "+".join(testbeds)
    out_dir.mkdir(parents=True, exist_ok=True)
    # an older shard gains the columns it lacks (schema changes so far only added columns): one schema, the current
    merged = pd.concat([r.reindex(columns=list(COLUMNS)) for r in results], ignore_index=True).assign(
        run_id=run_id, schema_version=SCHEMA_VERSION)
    merged_samples = pd.concat([s.reindex(columns=list(SAMPLE_COLUMNS)) for s in samples], ignore_index=True)
    merged_samples["run_id"] = run_id
    write_env(out_dir, _merge_env(envs, shard_dirs, [len(r) for r in results], run_id, testbed_id))
    if len(merged_samples):
        _write_atomic(merged_samples, out_dir / SAMPLES)
    _write_atomic(merged, out_dir / RESULTS)  # last: its presence marks a complete merge
    # Verify from disk, not from memory: what a later reader sees is what counts.
    back = load_results(out_dir)
    expected = sum(len(r) for r in results)
    if len(back) != expected or set(map(tuple, back[list(KEY)].values)) != set(map(tuple, keyed[list(KEY)].values)):
        raise RuntimeError(f"merge of {len(shard_dirs)} shards into {out_dir}: {len(back)} rows read back, "
                           f"{expected} expected")
    if len(load_samples(out_dir)) != sum(len(s) for s in samples):
        raise RuntimeError(f"merge into {out_dir}: samples read back differ from the shards' "
                           f"{sum(len(s) for s in samples)}")
    return back


def merge_shards(run_dir: str | Path, count: int | None = None, **kwargs) -> pd.DataFrame:
    """Merge the finished shard runs under run_dir/shards/ into run_dir; with `count`, require that many shards.
    ShardFailed while any shard has no exit status or did not complete (still running, or crashed)."""
    root = Path(run_dir) / SHARDS_DIR
    roots = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not roots or (count is not None and len(roots) != count):
        raise ValueError(f"{root}: found {len(roots)} shard directories, expected {count or 'at least 1'}")
    check_finished(roots)
    return merge_runs([shard_run_dir(r) for r in roots], run_dir, **kwargs)
