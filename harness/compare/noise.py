"""A testbed's noise model: every key's A/A spread from its stored runs, in <results>/noise/<testbed>.json."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from harness.measure.stats import KeyNoise, robust_sd
from harness.store.load import load_samples
from harness.store.schema import KEY

NOISE_DIR = "noise"
#: fewest same-code run medians (beyond one per group) before their spread is trusted over the rounds'
MIN_REPEATS = 3


def noise_path(results_dir: str | Path, testbed: str) -> Path:
    return Path(results_dir) / NOISE_DIR / f"{testbed}.json"


def _key_text(key: tuple) -> str:
    return "|".join(map(str, key))


def key_spreads(history: pd.DataFrame) -> pd.DataFrame:
    """Per key of one testbed's runs: the A/A sigma of log(run median ratio), its source and run count."""
    rows, medians, code = [], [], ["git_sha", "git_dirty", "torch", "backend_version"]
    for run_dir in history.drop_duplicates("run_dir").run_dir:
        samples = load_samples(run_dir)
        if samples.empty:
            continue
        samples = samples[samples.latency_ms > 0]
        per_round = samples.groupby([*KEY, "round"], sort=False).latency_ms.median().reset_index()
        medians.append(per_round.assign(log_ms=np.log(per_round.latency_ms), run_dir=run_dir))
    if not medians:
        return pd.DataFrame(columns=["key", "aa_sigma", "source", "runs"])
    ids = history[["run_dir", *KEY, *[c for c in code if c in history]]].drop_duplicates(["run_dir", *KEY])
    rounds = pd.concat(medians, ignore_index=True).merge(ids, on=["run_dir", *KEY], how="left")
    group_cols = [c for c in code if c in rounds] or ["run_dir"]  # without code ids every run stands alone
    for key, g in rounds.groupby(list(KEY), sort=False):
        # within a run: each round median's deviation from its run's median
        within = (g.log_ms - g.groupby("run_dir").log_ms.transform("median")).to_numpy()
        per_run = g.groupby("run_dir").log_ms.agg(["median", "size"]).reset_index()
        n_rounds = float(per_run["size"].median())
        per_run = per_run.merge(g.drop_duplicates("run_dir")[["run_dir", *group_cols]], on="run_dir")
        same_code = per_run.groupby(group_cols, dropna=False)["median"]  # a missing version is a value too
        deviations = (per_run["median"] - same_code.transform("median")).to_numpy()
        repeats = len(per_run) - same_code.ngroups
        if repeats >= MIN_REPEATS:
            # run medians of unchanged code: their spread is the A/A spread of one side; a ratio has two
            sigma, source = math.sqrt(2) * robust_sd(deviations) * math.sqrt(len(deviations) / repeats), "runs"
        else:
            # one run's rounds only: the spread of a median of n_rounds rounds, both sides
            sigma, source = math.sqrt(2) * robust_sd(within) / math.sqrt(max(n_rounds, 1.0)), "rounds"
        rows.append({"key": _key_text(key), "aa_sigma": sigma, "source": source, "runs": len(per_run)})
    return pd.DataFrame(rows)


def build_noise_model(history: pd.DataFrame, testbed: str, results_dir: str | Path) -> Path:
    """Write the noise model of `testbed` (its runs in `history`) to <results_dir>/noise/<testbed>.json."""
    runs = history[history.testbed_id.astype(str) == testbed]
    if runs.empty:
        raise ValueError(f"no runs of testbed {testbed!r} under {results_dir}")
    spreads = key_spreads(runs)
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
