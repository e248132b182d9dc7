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


def key_spreads(history: pd.DataFrame, rounds: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per key of one testbed's runs: the A/A sigma of log(run median ratio), its source and run count. `rounds`:
    the runs' per-round medians (run_round_medians; default: read from each run's samples.csv)."""
    if rounds is None:
        rounds = run_round_medians(history.drop_duplicates("run_dir").run_dir)
    if rounds.empty:
        return pd.DataFrame(columns=["key", "aa_sigma", "source", "runs"])
    code = [c for c in ("git_sha", "git_dirty", "torch", "backend_version") if c in history]
    ids = history[["run_dir", *KEY, *code]].drop_duplicates(["run_dir", *KEY])
    rounds = rounds.assign(log_ms=np.log(rounds.latency_ms.astype(float))).merge(ids, on=["run_dir", *KEY],
                                                                                 how="left")
    group_cols = code or ["run_dir"]  # without code ids every run stands alone
    keys, by_run = list(KEY), [*KEY, "run_dir"]
    # within a run: each round median's deviation from its run's median
    within = (rounds.log_ms - rounds.groupby(by_run, sort=False, observed=True).log_ms.transform("median")).abs()
    per_run = rounds.groupby(by_run, sort=False, observed=True).agg(
        median=("log_ms", "median"), size=("log_ms", "size"),
        **{f"_{c}": (c, "first") for c in group_cols if c != "run_dir"}).reset_index()
    per_run = per_run.rename(columns={f"_{c}": c for c in group_cols})
    # a missing version is a value too (dropna=False): runs of the same code
    same_code = per_run.groupby([*keys, *group_cols], sort=False, dropna=False, observed=True)["median"]
    per_run["deviation"] = (per_run["median"] - same_code.transform("median")).abs()
    per_key = per_run.groupby(keys, sort=False, observed=True)
    out = pd.DataFrame({"runs": per_key.size(), "n_rounds": per_key["size"].median().astype(float),
                        "dev_sd": MAD_SCALE * per_key.deviation.median(),
                        "groups": per_run.drop_duplicates([*keys, *group_cols]).groupby(
                            keys, sort=False, observed=True).size()})
    out["within_sd"] = MAD_SCALE * within.groupby([rounds[k] for k in keys], sort=False, observed=True).median()
    out["repeats"] = out.runs - out.groups
    # run medians of unchanged code: their spread is the A/A spread of one side; a ratio has two
    from_runs = math.sqrt(2) * out.dev_sd * np.sqrt(out.runs / out.repeats.where(out.repeats > 0))
    # one run's rounds only: the spread of a median of n_rounds rounds, both sides
    from_rounds = math.sqrt(2) * out.within_sd / np.sqrt(out.n_rounds.clip(lower=1.0))
    enough = out.repeats >= MIN_REPEATS
    return pd.DataFrame({"key": ["|".join(map(str, k)) for k in out.index],
                         "aa_sigma": np.where(enough, from_runs, from_rounds).astype(float),
                         "source": np.where(enough, "runs", "rounds"), "runs": out.runs.to_numpy()})


def build_noise_model(history: pd.DataFrame, testbed: str, results_dir: str | Path,
                      rounds: pd.DataFrame | None = None) -> Path:
    """Write the noise model of `testbed` (its runs in `history`; `rounds`: their per-round medians, default read
    from the runs' samples) to <results_dir>/noise/<testbed>.json."""
    runs = history[history.testbed_id.astype(str) == testbed]
    if runs.empty:
        raise ValueError(f"no runs of testbed {testbed!r} under {results_dir}")
    spreads = key_spreads(runs, rounds)
    finite = spreads[np.isfinite(spreads.aa_sigma.astype(float))] if len(spreads) else spreads
    model = {"testbed": testbed, "built": time.strftime("%Y-%m-%dT%H:%M:%S"), "runs": int(runs.run_dir.nunique()),
             "default_aa_sigma": float(finite.aa_sigma.median()) if len(finite) else None,
             "keys": {r.key: {"aa_sigma": float(r.aa_sigma), "source": r.source, "runs": int(r.runs)}
                      for r in finite.itertuples()}}
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
