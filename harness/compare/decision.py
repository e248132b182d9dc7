"""The decision for one key present in two runs: how its timing moved, and whether its correctness got worse."""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.measure.stats import GateConfig
from harness.store.schema import BAD, BETTER, LOST, NOT_RUN, PASS, SAME, WORSE


def truthy(value) -> bool:
    """A CSV boolean ('True', True, numpy bool) as bool."""
    return value is True or (isinstance(value, (str, np.bool_, bool)) and str(value).lower() == "true")


def correctness_change(base: pd.Series, new: pd.Series, cfg: GateConfig = GateConfig(),
                       same_inputs: bool = True) -> tuple[str, str]:
    """('worse' | 'lost' | 'better' | 'same', why) for one key present in both runs. Runs drawn from different
    seeds (same_inputs False) judged other inputs: their error figures are not comparable, so only a status change
    or new NaN/inf counts, not err_ratio's growth."""
    b, n = base.get("status"), new.get("status")
    notes = []  # each says why the key got worse
    if n in BAD and b not in BAD:
        notes.append(f"{b}->{n}: {new.get('reason', '')}".rstrip(": "))
    if truthy(new.get("nonfinite")) and not truthy(base.get("nonfinite")):
        notes.append("new non-finite values (NaN/inf)")
    b_ratio, n_ratio = (pd.to_numeric(side.get("err_ratio"), errors="coerce") for side in (base, new))
    if same_inputs and np.isfinite(b_ratio) and np.isfinite(n_ratio) and n_ratio - b_ratio >= cfg.err_growth:
        notes.append(f"err_ratio {b_ratio:.3g}->{n_ratio:.3g} (+{n_ratio - b_ratio:.2f} of the tolerance)")
    if notes:
        return WORSE, "; ".join(notes)
    if b == PASS and n in NOT_RUN:
        return LOST, f"pass->{n}: {new.get('reason', '')}".rstrip(": ")
    if b in BAD and n == PASS:
        return BETTER, f"{b}->pass"
    return SAME, ""
