"""The backend-level side of a paired re-measurement: each backend's (and phase's) verdict and the keys it settles."""

from __future__ import annotations

import math
from dataclasses import asdict, replace

import numpy as np
import pandas as pd

from harness.measure.pooled import ALL_PHASES, GroupVerdict, group_verdict, scope
from harness.store.schema import FASTER, SLOWER, UNCHANGED, UNDECIDED

GROUP_COLUMNS = tuple(GroupVerdict.__dataclass_fields__)


def rounds_agree(verdict: str, latest, earlier, margin: float) -> str:
    """'' when the keys' median log ratio of the latest round alone and of the rounds before it both say `verdict`
    (beyond the margin for slower or faster, within it for unchanged); else why not. Before a second round there is no
    earlier one: nothing is decided on one round."""
    centres = {}
    for part, values in (("the latest round", latest), ("the rounds before it", earlier)):
        values = [v for v in values if math.isfinite(v)]
        if not values:
            return "one round is not enough: a second must agree with it"
        centres[part] = float(np.median(values))
    edge = math.log(margin)
    says = {part: SLOWER if c > edge else FASTER if c < -edge else UNCHANGED for part, c in centres.items()}
    if all(v == verdict for v in says.values()):
        return ""
    return "the rounds disagree: " + ", ".join(f"{part} {math.exp(c):.3f}x" for part, c in centres.items())


class Groups:
    """The backends of a re-measurement's keys, and each backend's phases when it has several: their verdicts over
    the keys' counted pairs, looked at after every round at a level that halves each look from the second (alpha
    spending: half the groups' share at the second look, a quarter at the third...), and final once settled."""

    def __init__(self, keys: dict, margin: float, family_alpha: float):
        self.keys, self.margin = keys, margin  # keys: index -> remeasure._Key, shared with the loop
        phases: dict[str, set] = {}
        for k in keys.values():
            phases.setdefault(k.backend, set()).add(k.phase)
        self.names = [(b, ALL_PHASES) for b in sorted(phases)] + \
            [(b, p) for b in sorted(phases) if len(phases[b]) > 1 for p in sorted(phases[b])]
        self.alpha = family_alpha / len(self.names)
        self.verdicts: dict[tuple[str, str], GroupVerdict] = {}

    def members(self, name: tuple[str, str]) -> list:
        backend, phase = name
        return [k for k in self.keys.values() if k.backend == backend and phase in (ALL_PHASES, k.phase)]

    def look(self, looks: int) -> None:
        """Decide every group not yet settled on its keys' counted pairs, at this look's share of the level. A
        verdict must also hold on the latest round alone and on the rounds before it (rounds_agree): keys are
        independent of each other only within a side's moment, and a whole round slow on one side (its processes,
        not the code) moves every key at once."""
        level = self.alpha * 2.0 ** -(looks - 1)  # nothing is decided on the first look (rounds_agree)
        for name in self.names:
            if name in self.verdicts and self.verdicts[name].settled:
                continue
            members = [k for k in self.members(name) if k.pairs]
            verdict = group_verdict(*name, [k.log_ratio() for k in members], self.margin, level)
            if verdict.settled:
                latest, earlier = range(looks - 1, looks), range(0, looks - 1)
                why = rounds_agree(verdict.verdict, [k.log_ratio(latest) for k in members],
                                   [k.log_ratio(earlier) for k in members], self.margin)
                if why:
                    verdict = replace(verdict, verdict=UNDECIDED, more_pairs=max(len(members), 1),
                                      note=f"{verdict.note}, but {why}")
            self.verdicts[name] = verdict

    def of(self, key) -> list[GroupVerdict]:
        """The settled verdicts of the groups a key belongs to."""
        return [v for name in ((key.backend, ALL_PHASES), (key.backend, key.phase))
                if (v := self.verdicts.get(name)) is not None and v.settled]

    def settled(self, key) -> bool:
        return bool(self.of(key))

    def settles(self, key) -> GroupVerdict | None:
        """The group verdict that ends a key's re-measurement: its backend (or phase) slower - the gate fails on it,
        more pairs of its keys change nothing - or unchanged or faster while the key's own pairs lie within the
        margin (a key beyond it goes on: a backend unchanged as a whole can still have one key 2x slower)."""
        for v in self.of(key):
            if v.verdict == SLOWER:
                return v
            lr = key.log_ratio()
            if v.verdict in (UNCHANGED, FASTER) and math.isfinite(lr) and abs(lr) <= math.log(self.margin):
                return v
        return None

    def undecided(self) -> list[GroupVerdict]:
        return [v for v in self.verdicts.values() if not v.settled]

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(v) for v in self.verdicts.values()], columns=list(GROUP_COLUMNS))

    def summary(self) -> str:
        return ", ".join(f"{scope(v.backend, v.phase)} {v.verdict}"
                         + (f" ({v.ratio:.3g}x over {v.keys} keys)" if math.isfinite(v.ratio) else "")
                         for v in self.verdicts.values())
