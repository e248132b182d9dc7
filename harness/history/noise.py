"""A testbed's noise model: every key's A/A spread from its stored runs, in <results>/noise/<testbed>.json."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from harness.history.index import CODE_COLUMNS
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
    from harness.history.index import round_median_rows
    frames = [round_median_rows(load_samples(run_dir)).assign(run_dir=run_dir) for run_dir in run_dirs]
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
    the runs' per-round medians (run_round_medians; default: read from each run's samples.csv)."""
    return key_spreads_of_parts([(history, rounds)])


def key_spreads_of_parts(parts: Iterable[tuple[pd.DataFrame, pd.DataFrame | None]]) -> pd.DataFrame:
    """key_spreads of the runs of every (history, rounds) part, each part some runs whole (no run in two parts):
    each part is brought down to one line per (key, run) before the next is read, so the peak memory follows a
    part, not the testbed (1,500 runs: the rows and rounds of 375 runs of a testbed at once were over 1 GB)."""
    pairs, within, rounds_pair, offset = [], [], [], 0
    for history, rounds in parts:
        part = _run_pairs(history, rounds)
        if part is not None:
            pairs.append(part[0])
            within.append(part[1])
            rounds_pair.append(part[2] + offset)
            offset += len(part[0])
    if not pairs:
        return pd.DataFrame(columns=["key", "aa_sigma", "source", "runs"])
    return _spreads(_stacked(pairs), np.concatenate(within), np.concatenate(rounds_pair))


def _stacked(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The frames one below the other, a column categorical in each staying categorical (over the union of their
    categories; pd.concat makes it objects, 8 bytes a cell and slower to group, when the categories differ)."""
    for column in frames[0].columns:
        if all(isinstance(f[column].dtype, pd.CategoricalDtype) for f in frames):
            union = pd.Index(pd.unique(np.concatenate([np.asarray(f[column].cat.categories, dtype=object)
                                                       for f in frames])))
            for f in frames:
                f[column] = f[column].cat.set_categories(union)
    return pd.concat(frames, ignore_index=True)


def _run_pairs(history: pd.DataFrame, rounds: pd.DataFrame | None):
    """One line per (key, run) of `rounds` in order of first appearance: the key, the code it ran (history's code
    columns; all missing for a run absent from `history`), the median of its log round medians and its rounds;
    and per round, its deviation from its run's median and its line's number. None without rounds. Grouped by
    integer codes of (key, run): 2M round medians in seconds."""
    if rounds is None:
        rounds = run_round_medians(history.drop_duplicates("run_dir").run_dir)
    if rounds.empty:
        return None
    code = [c for c in CODE_COLUMNS if c in history]
    ids = history[["run_dir", *KEY, *code]].drop_duplicates(["run_dir", *KEY])
    pair_of, pair_of_id = _joint_codes([rounds, ids], [*KEY, "run_dir"])
    log_ms = np.log(rounds.latency_ms.to_numpy(dtype=float))
    run_median = _median_by(log_ms, pair_of)
    within = np.abs(log_ms - run_median.to_numpy()[pair_of])  # each round median's deviation from its run's
    pairs, first = np.unique(pair_of, return_index=True)  # pair codes are dense: pairs is 0..n-1
    out = rounds[list(KEY)].iloc[first].reset_index(drop=True)
    row = pd.Index(pair_of_id).get_indexer(pairs)  # each pair's line of ids, -1 where the run is not in history
    known = pd.Series(row >= 0)
    for c in code:
        out[c] = ids[c].iloc[np.where(row >= 0, row, 0)].reset_index(drop=True).where(known)
    out["median"], out["rounds"] = run_median.to_numpy(), np.bincount(pair_of).astype(float)
    return out, within, pair_of


def _spreads(pairs: pd.DataFrame, within: np.ndarray, round_pair: np.ndarray) -> pd.DataFrame:
    """The A/A sigma per key of its (key, run) lines (_run_pairs'), keys in order of first appearance."""
    keys = list(KEY)
    pair_key, = _joint_codes([pairs], keys)
    code = [c for c in CODE_COLUMNS if c in pairs]
    # runs of the same code (a missing version is a value too, and a run absent from history ran no known code)
    group_of = _joint_codes([pairs], [*keys, *code])[0] if code else np.arange(len(pairs))  # else each alone
    median = pairs["median"].to_numpy()
    deviation = np.abs(median - _median_by(median, group_of).to_numpy()[group_of])
    n_keys = int(pair_key.max()) + 1
    runs = np.bincount(pair_key, minlength=n_keys)
    groups = np.bincount(pd.Series(pair_key).groupby(group_of, sort=True).first().to_numpy(), minlength=n_keys)
    n_rounds = _median_by(pairs["rounds"].to_numpy(), pair_key).to_numpy()
    dev_sd = MAD_SCALE * _median_by(deviation, pair_key).to_numpy()
    within_sd = MAD_SCALE * _median_by(within, pair_key[round_pair]).to_numpy()
    repeats = runs - groups
    # run medians of unchanged code: their spread is the A/A spread of one side; a ratio has two
    from_runs = math.sqrt(2) * dev_sd * np.sqrt(runs / np.where(repeats > 0, repeats, np.nan))
    # one run's rounds only: the spread of a median of n_rounds rounds, both sides
    from_rounds = math.sqrt(2) * within_sd / np.sqrt(np.clip(n_rounds, 1.0, None))
    enough = repeats >= MIN_REPEATS
    named = pairs[keys].iloc[np.unique(pair_key, return_index=True)[1]]
    return pd.DataFrame({"key": ["|".join(map(str, k)) for k in named.itertuples(index=False, name=None)],
                         "aa_sigma": np.where(enough, from_runs, from_rounds).astype(float),
                         "source": np.where(enough, "runs", "rounds"), "runs": runs})


def _is_text(column: pd.Series, text: str) -> np.ndarray:
    """column.astype(str) == text, asked of a categorical column's categories only (not of its 2M cells)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        hit = np.asarray(column.cat.categories.astype(str) == text)
        return np.r_[hit, str(np.nan) == text][column.cat.codes.to_numpy()]  # code -1: a missing value, 'nan'
    return (column.astype(str) == text).to_numpy()


def build_noise_model(history: pd.DataFrame | Iterable[tuple[pd.DataFrame, pd.DataFrame | None]], testbed: str,
                      results_dir: str | Path, rounds: pd.DataFrame | None = None) -> Path:
    """Write the noise model of `testbed` (its runs in `history`; `rounds`: their per-round medians, default read
    from the runs' samples) to <results_dir>/noise/<testbed>.json. `history` may instead be (history, rounds)
    parts, each some runs whole (HistoryIndex.noise_parts): read a part at a time."""
    parts = [(history, rounds)] if isinstance(history, pd.DataFrame) else history
    counted = []

    def of_testbed():
        for rows, part_rounds in parts:
            rows = rows[_is_text(rows.testbed_id, testbed)]
            counted.append(rows.run_dir.nunique())
            if len(rows):
                yield rows, part_rounds

    spreads = key_spreads_of_parts(of_testbed())
    if not sum(counted):
        raise ValueError(f"no runs of testbed {testbed!r} under {results_dir}")
    finite = spreads[np.isfinite(spreads.aa_sigma.astype(float))] if len(spreads) else spreads
    model = {"testbed": testbed, "built": time.strftime("%Y-%m-%dT%H:%M:%S"), "runs": int(sum(counted)),
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
