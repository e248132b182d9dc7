"""The pick in a serving framework's terms: the fastest measured backend the framework can run, the setting to
paste, and how it compares with what the framework would choose on its own."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.advisor.frameworks import CHOOSERS, FrameworkChoice, Target
from harness.advisor.mix import COVERAGE, TrafficMix, compare
from harness.advisor.ranking import Recommendation
from harness.advisor.workload import Workload
from harness.backends.registry import all_backends
from harness.backends.serving import FRAMEWORKS, ServingKnob


@dataclass(frozen=True)
class FrameworkAdvice:
    """For one framework: what it would choose (`choice`), the fastest measured backend it can run (`pick`, with
    its setting `knob`), per part where the framework picks prefill and decode apart (`parts`), the measured
    difference (`versus`) and the lines to paste (`settings`)."""

    framework: str
    choice: FrameworkChoice
    pick: str | None
    knob: ServingKnob | None
    versus: str
    settings: tuple[str, ...] = ()
    parts: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"framework": self.framework, "would_choose": self.choice.value, "would_choose_backend":
                self.choice.backend, "why": self.choice.why, "rules": self.choice.rules,
                "passed_over": list(self.choice.passed_over), "pick": self.pick,
                "setting": None if self.knob is None else self.knob.value, "versus": self.versus,
                "settings": list(self.settings), "parts": dict(self.parts)}


def _knob(backend: str, framework: str) -> ServingKnob | None:
    """The setting backend `backend` declares for `framework` (one a framework), None when it declares none."""
    declared = all_backends().get(backend)
    return next((k for k in declared.serving if k.framework == framework), None) if declared else None


def framework_advice(framework: str, target: Target, workloads: list[Workload],
                     recommendations: dict[str, Recommendation], mix: TrafficMix, seed: int = 0) -> FrameworkAdvice:
    """`framework`'s advice over the workloads: its own choice (by its rules, on the first workload's case: the
    rules read the model's head size, dtype, sinks, cache, which the shapes of one file share), the fastest measured
    backend it can run over the mix (`mix.overall`'s weighted times), and the difference between the two."""
    choice = CHOOSERS[framework](target, workloads[0].case())
    runnable = [b for b in sorted(mix.overall.times, key=mix.overall.times.get) if _knob(b, framework) is not None]
    pick = runnable[0] if runnable else None
    knob = None if pick is None else _knob(pick, framework)
    versus = _versus(choice, pick, workloads, recommendations, mix, seed)
    settings, parts = list(knob.settings() if knob else []), {}
    if framework == "sglang":
        for part in ("prefill", "decode"):
            split = mix.parts.get(part)
            if split is None:
                continue
            fastest = [b for b in sorted(split.times, key=split.times.get) if _knob(b, framework) is not None]
            if fastest:
                parts[part] = fastest[0]
        if len(set(parts.values())) == 2:  # prefill and decode served apart
            settings = [line for part, backend in parts.items()
                        for line in _knob(backend, framework).settings(part)]
    return FrameworkAdvice(framework, choice, pick, knob, versus, tuple(settings), parts)


def _versus(choice: FrameworkChoice, pick: str | None, workloads: list[Workload],
            recommendations: dict[str, Recommendation], mix: TrafficMix, seed: int) -> str:
    own = choice.backend
    if pick is None:
        return f"no backend measured here has a {choice.framework} setting"
    if own is None:
        return (f"{choice.framework}'s own choice, {choice.value}, runs kernels no backend here runs: not measured; "
                f"{pick} is the fastest measured here that {choice.framework} can run")
    if own == pick:
        return f"its own choice is also the fastest measured here that it can run ({pick})"
    if own not in mix.overall.times:
        why = mix.overall.excluded.get(own, "not measured")
        return f"{choice.value} ({own}) could not be compared: {why}; {pick} is the fastest it can run here"
    ratio, low, high, ahead = compare(pick, own, workloads, recommendations, seed)
    return (f"{pick} measured {ratio:.2f}x faster than {own} ({choice.value}) on this "
            f"{'mix' if len(workloads) > 1 else 'workload'} ({COVERAGE:.0%} interval {low:.2f}-{high:.2f}x; "
            f"{own} ahead in {ahead:.1%} of resamples)") if math.isfinite(ratio) else f"{own}: not comparable"


def all_advice(target: Target, workloads: list[Workload], recommendations: dict[str, Recommendation],
               mix: TrafficMix, seed: int = 0) -> list[FrameworkAdvice]:
    return [framework_advice(f, target, workloads, recommendations, mix, seed) for f in FRAMEWORKS]


def format_advice(advice: list[FrameworkAdvice], target: Target, measured_on: str, paste: tuple[str, ...]) -> str:
    """What each framework would choose beside what was measured; the lines to paste for the frameworks in
    `paste` (recommend --for)."""
    lines = [f"in the serving stack's terms (rules applied for {target.describe()}; measured on {measured_on}):"]
    for a in advice:
        lines.append(f"  {a.choice.describe()}")
        lines.append(f"    measured: {a.versus}")
    for a in advice:
        if a.framework not in paste:
            continue
        if not a.settings:
            lines.append(f"for {a.framework}: nothing to set - no backend measured here has a {a.framework} setting")
            continue
        what = ", ".join(f"{part}: {b}" for part, b in a.parts.items()) if len(set(a.parts.values())) == 2 else a.pick
        lines.append(f"for {a.framework} ({what}):")
        lines += [f"  {line}" for line in a.settings]
        if a.knob is not None and a.knob.note:
            lines.append(f"  # note: {a.knob.note}")
    return "\n".join(lines)
