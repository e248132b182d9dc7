"""A testbed's noise model: every key's A/A spread from its stored runs, in <results>/noise/<testbed>.json."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from harness.measure.stats import MAD_SCALE, KeyNoise
from harness.store.load import load_samples
from harness.store.schema import KEY

NOISE_DIR = "noise"
#: fewest same-code run medians (beyond one per group) before their spread is trusted over the rounds'
MIN_REPEATS = 3


def noise_path(results_dir: str | Path, testbed: str) -> Path:
    return Path(results_dir) / NOISE_DIR / f"{testbed}.json"


def _key_text(key: tuple) -> str:
    return "|".join(map(str, key))


def run_round_medians(run_dirs) -> pd.DataFrame:
    """Per-round medians (case, backend, phase, round, latency_ms, run_dir) of each run's samples.csv."""
    from harness.compare.index import round_medians
    frames = [round_medians(load_samples(run_dir)).assign(run_dir=run_dir) for run_dir in run_dirs]
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*KEY, "round", "latency_ms",
                                                                                      "run_dir"])


def _joint_codes(frames: list[pd.DataFrame], columns: list[str]) -> list[np.ndarray]:
    """Per row of each frame, one integer for its values in `columns`, equal across the frames exactly when the
    values are (missing ones equal too, as groupby(dropna=False) and merge take them): a grouping by one int64
    column instead of several text ones, numbered 0, 1... in order of first appearance (the first frame first)."""
    joint, span = [np.zeros(len(f), dtype=np.int64) for f in frames], 1
    for column in columns:
        parts = [f[column] for f in frames]
        seen = [p.cat.categories if isinstance(p.dtype, pd.CategoricalDtype) else pd.Index(p.dropna().unique())
                for p in parts]
        values = pd.Index(pd.unique(np.concatenate([np.asarray(v, dtype=object) for v in seen])))
        if span * (len(values) + 1) >= 2 ** 62:  # numbered densely before the product could overflow
            joint, span = _dense(joint), sum(len(j) for j in joint) + 1
        for i, p in enumerate(parts):
            if isinstance(p.dtype, pd.CategoricalDtype):
                local = np.r_[values.get_indexer(p.cat.categories), -1]  # a code of -1 (missing) stays -1
                code = local[p.cat.codes.to_numpy()]
            else:
                code = np.where(p.isna().to_numpy(), -1, values.get_indexer(p.astype(object).where(p.notna(), None)))
            joint[i] = joint[i] * (len(values) + 1) + (code + 1)
        span *= len(values) + 1
    return _dense(joint)


def _dense(joint: list[np.ndarray]) -> list[np.ndarray]:
    """The codes numbered 0, 1... in order of first appearance across the arrays."""
    dense = pd.factorize(np.concatenate(joint))[0].astype(np.int64)
    return np.split(dense, np.cumsum([len(j) for j in joint])[:-1])


def _median_by(values: np.ndarray, groups: np.ndarray) -> pd.Series:
    """The median of `values` per group code (pandas' group median: the same floats as a groupby on the texts)."""
    return pd.Series(values).groupby(groups, sort=True).median()


def key_spreads(history: pd.DataFrame, rounds: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per key of one testbed's runs: the A/A sigma of log(run median ratio), its source and run count. `rounds`:
    the runs' per-round medians (run_round_medians; default: read from each run's samples.csv). Grouped by integer
    codes of (key), (key, run) and (key, code) at once: 2M round medians of a testbed in seconds."""
    if rounds is None:
        rounds = run_round_medians(history.drop_duplicates("run_dir").run_dir)
    if rounds.empty:
        return pd.DataFrame(columns=["key", "aa_sigma", "source", "runs"])
    code = [c for c in ("git_sha", "git_dirty", "torch", "backend_version") if c in history]
    ids = history[["run_dir", *KEY, *code]].drop_duplicates(["run_dir", *KEY])
    keys = list(KEY)
    key_of, = _joint_codes([rounds], keys)  # in order of first appearance: the order of the answer
    pair_of, pair_of_id = _joint_codes([rounds, ids], [*keys, "run_dir"])
    log_ms = np.log(rounds.latency_ms.to_numpy(dtype=float))
    # within a run: each round median's deviation from its run's median
    run_median = _median_by(log_ms, pair_of)
    within = np.abs(log_ms - run_median.to_numpy()[pair_of])
    # per (key, run): its median, its rounds, its key and the code it ran (a run absent from `history`: missing)
    pairs, first = np.unique(pair_of, return_index=True)  # pair codes are dense: pairs is 0..n-1
    size = np.bincount(pair_of)
    pair_key = key_of[first]
    if code:
        # the code each (run, key) ran, numbered (ids holds each pair once); a pair not in history ran the code of
        # no known values, as the merge's missing cells say: the number of a row with every code value missing
        ran, = _joint_codes([ids], code)
        unknown = ids[code].isna().all(axis=1).to_numpy()
        none_ran = ran[unknown][0] if unknown.any() else (int(ran.max()) + 1 if len(ran) else 0)
        row = pd.Index(pair_of_id).get_indexer(pairs)
        code_of = np.where(row >= 0, ran[np.where(row >= 0, row, 0)], none_ran)
        group_of = pd.factorize(pair_key * (int(code_of.max()) + 1) + code_of)[0]
    else:  # without code ids every run stands alone
        group_of = np.arange(len(pairs))
    median = run_median.to_numpy()
    # a missing version is a value too: runs of the same code
    deviation = np.abs(median - _median_by(median, group_of).to_numpy()[group_of])
    n_keys = int(key_of.max()) + 1
    runs = np.bincount(pair_key, minlength=n_keys)
    groups = np.bincount(pd.Series(pair_key).groupby(group_of, sort=True).first().to_numpy(), minlength=n_keys)
    n_rounds = _median_by(size.astype(float), pair_key).to_numpy()
    dev_sd = MAD_SCALE * _median_by(deviation, pair_key).to_numpy()
    within_sd = MAD_SCALE * _median_by(within, key_of).to_numpy()
    repeats = runs - groups
    # run medians of unchanged code: their spread is the A/A spread of one side; a ratio has two
    from_runs = math.sqrt(2) * dev_sd * np.sqrt(runs / np.where(repeats > 0, repeats, np.nan))
    # one run's rounds only: the spread of a median of n_rounds rounds, both sides
    from_rounds = math.sqrt(2) * within_sd / np.sqrt(np.clip(n_rounds, 1.0, None))
    enough = repeats >= MIN_REPEATS
    named = rounds[keys].iloc[np.unique(key_of, return_index=True)[1]]
    return pd.DataFrame({"key": ["|".join(map(str, k)) for k in named.itertuples(index=False, name=None)],
                         "aa_sigma": np.where(enough, from_runs, from_rounds).astype(float),
                         "source": np.where(enough, "runs", "rounds"), "runs": runs})


def _is_text(column: pd.Series, text: str) -> np.ndarray:
    """column.astype(str) == text, asked of a categorical column's categories only (not of its 2M cells)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        hit = np.asarray(column.cat.categories.astype(str) == text)
        return np.r_[hit, str(np.nan) == text][column.cat.codes.to_numpy()]  # code -1: a missing value, 'nan'
    return (column.astype(str) == text).to_numpy()


def build_noise_model(history: pd.DataFrame, testbed: str, results_dir: str | Path,
                      rounds: pd.DataFrame | None = None) -> Path:
    """Write the noise model of `testbed` (its runs in `history`; `rounds`: their per-round medians, default read
    from the runs' samples) to <results_dir>/noise/<testbed>.json."""
    runs = history[_is_text(history.testbed_id, testbed)]
    if runs.empty:
        raise ValueError(f"no runs of testbed {testbed!r} under {results_dir}")
    spreads = key_spreads(runs, rounds)
    finite = spreads[np.isfinite(spreads.aa_sigma.astype(float))] if len(spreads) else spreads
    model = {"testbed": testbed, "built": time.strftime("%Y-%m-%dT%H:%M:%S"), "runs": int(runs.run_dir.nunique()),
             "default_aa_sigma": float(finite.aa_sigma.median()) if len(finite) else None,
             "keys": {key: {"aa_sigma": float(sigma), "source": source, "runs": int(runs)}
                      for key, sigma, source, runs in zip(finite.key, finite.aa_sigma, finite.source, finite.runs)}}
    path = noise_path(results_dir, testbed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(model, indent=1))
    return path


class NoiseModel:
    """A testbed's stored noise model: the A/A sigma of a key, or the testbed's median for a key it lacks."""

    def __init__(self, data: dict, path: Path | None = None):
        self.data, self.path = data, path

    @classmethod
    def load(cls, path: str | Path) -> "NoiseModel":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a noise model (line {exc.lineno}: {exc.msg}); rebuild it with "
                             "`python -m harness history --noise`") from None
        if not isinstance(data, dict) or not isinstance(data.get("keys"), dict):
            raise ValueError(f"{path}: not a noise model (no 'keys'); rebuild it with `history --noise`")
        return cls(data, path)

    @classmethod
    def for_run(cls, run_dir: str | Path, testbed: str) -> "NoiseModel | None":
        """The model stored beside a run (its results directory's noise/<testbed>.json), if any."""
        path = noise_path(Path(run_dir).parent, testbed)
        return cls.load(path) if path.exists() else None

    def key(self, key: tuple) -> KeyNoise | None:
        entry = self.data["keys"].get(_key_text(key))
        if entry is not None:
            return KeyNoise(entry["aa_sigma"], entry.get("runs", 0))
        default = self.data.get("default_aa_sigma")
        return None if default is None else KeyNoise(default, 0)

    def summary(self) -> str:
        sigmas = np.array([k["aa_sigma"] for k in self.data["keys"].values()], float)
        if not len(sigmas):
            return f"noise model {self.path}: no timed keys"
        sources = pd.Series([k["source"] for k in self.data["keys"].values()]).value_counts().to_dict()
        return (f"noise model of testbed {self.data.get('testbed')} ({self.path}, built {self.data.get('built')}, "
                f"{self.data.get('runs')} runs): {len(sigmas)} keys, A/A sigma of the log ratio median "
                f"{np.median(sigmas):.1%}, 90th pct {np.percentile(sigmas, 90):.1%}, max {sigmas.max():.1%} "
                f"(from repeated runs: {sources.get('runs', 0)}, from one run's rounds: {sources.get('rounds', 0)})")
