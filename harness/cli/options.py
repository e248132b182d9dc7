"""Every command-line option, defined once and fed to both front ends: argparse and pytest's addoption."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from harness.isolation.supervisor import DEFAULT_TIMEOUT_S
from harness.measure import stats, timing
from harness.cases.matrices import AUTO, FUZZ, MATRICES, resolve_matrix
from harness.cases.presets import PRESETS


def _validator(kind: type, ok: Callable[[Any], bool], what: str) -> Callable[[str], Any]:
    """argparse's `type` for a number that must satisfy `ok`: 'argument --rounds: must be an integer >= 1; got 0'."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}; got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {what}; got {text}")
        return value
    parse.__name__ = what  # argparse names the type in some messages
    return parse


positive_int = _validator(int, lambda v: v >= 1, "an integer >= 1")
seed = _validator(int, lambda v: v >= 0, "an integer >= 0")
#: NaN, inf, zero and negatives are refused
positive_float = _validator(float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")
nonnegative_float = _validator(float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")
probability = _validator(float, lambda v: 0 < v < 1, "between 0 and 1 (exclusive), e.g. 0.9")


def call_timeout(text: str) -> tuple[str, float]:
    """'SECONDS' (every call) or 'CASE_ID_PATTERN=SECONDS' (cases whose id matches the fnmatch pattern)."""
    pattern, _, seconds = text.rpartition("=")
    return pattern or "*", positive_float(seconds)


call_timeout.__name__ = "SECONDS or CASE_PATTERN=SECONDS"


@dataclass(frozen=True)
class Option:
    """One flag: its argparse keywords (which pytest's addoption takes too)."""
    flag: str
    help: str
    kwargs: dict = field(default_factory=dict)
    #: argparse's `type`: a validator that refuses bad values in one line (positive_int, ...)
    parse: Callable[[str], Any] | None = None

    def keywords(self, **overrides: Any) -> dict:
        kwargs = {**self.kwargs, **overrides}
        if self.parse is not None:
            kwargs["type"] = self.parse
        # argparse reads the value itself (%(default)s), so help never repeats a default by hand; a literal % is doubled
        shown = "" if kwargs.get("default") in (None, False, []) or kwargs.get("action") else " (default: %(default)s)"
        return {**kwargs, "help": self.help.replace("%", "%%") + shown}


OPTIONS: dict[str, Option] = {o.flag.lstrip("-").replace("-", "_"): o for o in [
    Option("--backends", "comma-separated backend names, or 'all'", {"default": "all"}),
    Option("--backend-module", "module name or .py path registering extra backends (repeatable)",
           {"action": "append", "default": []}),
    Option("--matrix", f"case matrix: {AUTO} ({resolve_matrix(AUTO, 'cuda')} on a CUDA device, "
                       f"{resolve_matrix(AUTO, 'cpu')} elsewhere), {', '.join(MATRICES)}, or {FUZZ} (seeded random cases, "
                       "sized by --fuzz-budget-s)", {"default": AUTO}),
    Option("--preset", f"cases from a model's attention shape instead of a matrix: {', '.join(PRESETS)}"),
    Option("--hf-config", "cases from a local transformers config.json (num_attention_heads, num_key_value_heads, "
                          "head_dim or hidden_size, sliding_window) instead of a matrix; nothing is downloaded"),
    Option("--case", "check only the case of this id, as a run prints it (e.g. 'fp32-b2-h4-s64-d32-causal'), instead of a "
                     "matrix; repeatable; a failing row's repro command gives it with --seed",
           {"action": "append", "default": []}),
    Option("--fuzz", "check seeded random cases drawn within what each backend declares instead of a matrix, and "
                     "shrink each failure to the smallest case that fails the same check (docs/fuzzing.md)",
           {"action": "store_true"}),
    Option("--fuzz-budget-s", "seconds of checking --fuzz draws cases for by the cost model and runs them for in "
                              "wall time (the shrinking has its own bound, docs/fuzzing.md)", {"default": 60.0},
           positive_float),
    Option("--batch", "batch size of the workload (with --preset/--hf-config: of the model's cases)", {}, positive_int),
    Option("--seq", "query and key length (with --preset/--hf-config: of the model's cases)", {}, positive_int),
    Option("--allow-expensive", "run even when the float64 reference and the baseline are estimated to take over "
                                "an hour, or a case to need more memory than the device has",
           {"action": "store_true"}),
    Option("--device", "cpu, cuda, cuda:N or auto", {"default": "auto"}),
    Option("--results-dir", "where run directories go", {"default": "results"}),
    Option("--seed", "input seed (default: one drawn for the run, so no kernel can know its inputs ahead; "
                     "env.json records it, and --seed with it reproduces them)", {"default": None}, seed),
    Option("--threads", "CPU threads for torch (default: torch's choice); recorded", {}, positive_int),
    Option("--timing-budget-ms", "time budget per timed key in ms, split over --rounds; repetitions = budget / "
                                 f"estimated latency, after a warm-up of {timing.WARMUP_SHARE:.0%} of the budget",
           {"default": timing.BUDGET_MS}, positive_float),
    Option("--rounds", "measurement rounds per timed (case, backend, phase), spread over the run, each with "
                       "1/rounds of the budget; compare needs >= 2 to tell a transient from a regression",
           {"default": 3}, positive_int),
    Option("--benchmark", "also measure latency, peak memory and FLOP/s of every correct (case, backend, phase)",
           {"action": "store_true", "dest": "benchmark_enabled"}),
    Option("--cuda-graph", "GPU: time forward replays of a captured CUDA graph", {"action": "store_true"}),
    Option("--cpu-mem-budget-gb", "CPU: record a case as oom when its measured peak memory exceeds this many GiB",
           {}, positive_float),
    Option("--no-report", "skip the figures and report/report.html at the end of the run",
           {"action": "store_false", "dest": "report"}),
    Option("--shard", "run only shard i of n of the cases, as 'i/n' (default: all)"),
    Option("--no-isolate", "run backends in this process instead of supervised worker processes (debugging; a "
                           "crash or hang of a backend then ends the run)",
           {"action": "store_false", "dest": "isolate"}),
    Option("--call-timeout-s", "seconds one backend call may run before its worker is killed and the call is an "
                               f"error row (default: {DEFAULT_TIMEOUT_S:g}); CASE_PATTERN=SECONDS for cases whose id "
                               "matches (fnmatch), e.g. 'bf16-b4-*=900'; repeatable",
           {"action": "append", "default": []}, call_timeout),
    # the gate's thresholds (harness/measure/stats.py says why each default)
    Option("--min-effect", "smallest ratio change that counts (a key's noise model may raise it, never lower it)",
           {"default": stats.MIN_RUN_CHANGE}, nonnegative_float),
    Option("--confidence", "two-sided confidence of each key's ratio interval", {"default": stats.CONFIDENCE},
           probability),
    Option("--noise-z", "a key's margin is at least this many A/A standard deviations of its noise model",
           {"default": stats.NOISE_Z}, nonnegative_float),
    Option("--abs-floor-ms", "smallest median change (ms) that counts", {"default": stats.ABS_FLOOR_MS},
           nonnegative_float),
    Option("--err-growth", "err_ratio increase flagged as worse", {"default": stats.ERR_GROWTH}, nonnegative_float),
]}


def _add(add: Callable[..., Any], names: tuple[str, ...], defaults: dict | None) -> None:
    for name in names:
        extra = {"default": defaults[name]} if defaults and name in defaults else {}
        add(OPTIONS[name].flag, **OPTIONS[name].keywords(**extra))


def add_to_argparse(parser, *names: str, defaults: dict | None = None) -> None:
    """Add the named options to an argparse parser or group; `defaults` overrides some defaults by name."""
    _add(parser.add_argument, names, defaults)


def add_to_pytest(group, *names: str, defaults: dict | None = None) -> None:
    """Add the named options to a pytest option group (pytest's addoption takes argparse's keywords)."""
    _add(group.addoption, names, defaults)


def compare_config(args: argparse.Namespace):
    """The GateConfig the gate's thresholds on the command line describe."""
    return stats.GateConfig(**{name: getattr(args, name) for name in COMPARE_THRESHOLDS})


COMPARE_THRESHOLDS = ("min_effect", "confidence", "noise_z", "abs_floor_ms", "err_growth")
