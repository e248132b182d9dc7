"""`python -m harness recommend`: the deployment advisor's command (its presentation is advisor/table.py)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import pandas as pd

from harness.cli.options import add_to_argparse, positive_int
from harness.measure.timing import ADVISOR_TIMING, TimingConfig
from harness.backends.serving import FRAMEWORKS
from harness.cases.masks import MASK_NAMES

SHAPE_FLAGS = ("batch", "heads", "kv_heads", "seq", "seq_k", "head_dim")


def _recommend(args: argparse.Namespace) -> int:
    import torch
    from harness.advisor.recommend import recommend_many, step_weights
    from harness.advisor.table import format_overall, format_table
    from harness.advisor.workload import Workload, load_workloads, model_workloads
    from harness.backends.registry import get_backends
    from harness.isolation.plugin_host import load_backend_module
    from harness.cli.backends import available_here
    from harness.calls.device import resolve_device
    from harness.isolation.executor import make_executor
    from harness.run.session import run_seed
    from harness.isolation.supervisor import timeouts
    from harness.planning.cost import Job, check_cost
    from harness.cases.presets import model_shape
    for module in args.backend_module:
        load_backend_module(module, here=not args.isolate)  # imported here only with --no-isolate
    if args.threads is not None:  # CPU latency depends on it; recorded in each table's header
        torch.set_num_threads(args.threads)
    given = [f"--{f.replace('_', '-')}" for f in SHAPE_FLAGS if getattr(args, f) is not None]
    model = model_shape(args.preset, args.hf_config)
    # a serving step: one query (decode) or the speculated tokens (verification) over --seq cached keys
    mixed = args.serving_step
    if mixed is not None and (args.decode or args.spec_len is not None or args.batch is not None):
        raise ValueError("--serving-step sets the batch and its query lengths; drop --decode, --spec-len and --batch")
    decode = args.decode or args.spec_len is not None or args.page_size is not None
    seq_q = (args.spec_len or 1) if decode else args.seq
    step = (f" verify{args.spec_len}" if args.spec_len else " decode" if decode and not mixed else "") + \
        (f" page{args.page_size}" if args.page_size else "")
    if args.workload:
        if given or model:
            extra = given + (["--preset/--hf-config"] if model else [])
            raise ValueError(f"--workload {args.workload} describes the shapes; drop {', '.join(extra)}")
        workloads = load_workloads(args.workload, training=True if args.training else None)
    elif model is not None:
        # the model gives heads, kv heads, head dim and mask; the deployment gives batch and sequence
        taken = [f for f in ("--heads", "--kv-heads", "--head-dim") if getattr(args, f[2:].replace("-", "_"))]
        if taken or args.mask is not None:
            raise ValueError(f"{model.name} sets heads, kv heads, head dim and mask; drop "
                             f"{', '.join(taken + (['--mask'] if args.mask is not None else []))}")
        need = [f for f in ("--batch", "--seq") if getattr(args, f[2:]) is None and not (mixed and f == "--batch")]
        if need:
            raise ValueError(f"--preset/--hf-config needs the deployment's {' and '.join(need)}")
        workloads = model_workloads(model, args.batch, args.seq, seq_k=args.seq_k, dtype=args.dtype,
                                    training=args.training, seq_q=seq_q, page_size=args.page_size, step=step,
                                    serving_step=mixed)
    else:
        need = [f"--{f.replace('_', '-')}" for f in ("batch", "heads", "seq", "head_dim") if getattr(args, f) is None
                and not (mixed and f == "batch")]
        if need:
            raise ValueError(f"recommend needs --workload FILE, or the shape: missing {', '.join(need)}")
        if mixed:
            from harness.cases.serving_step import parse_mix
            mix = parse_mix(mixed)
            workloads = [Workload(mix.batch, args.heads, max(mix.q_lens), args.head_dim, kv_heads=args.kv_heads,
                                  seq_k=args.seq_k or args.seq, dtype=args.dtype, page_size=args.page_size,
                                  name=f"step {mix.id} s{args.seq}{step}", serving_step=mix.id)]
        else:
            workloads = [Workload(args.batch, args.heads, seq_q, args.head_dim, kv_heads=args.kv_heads,
                                  seq_k=args.seq_k or (args.seq if decode else None), dtype=args.dtype,
                                  mask=args.mask or ("causal-br" if decode else "causal"), training=args.training,
                                  page_size=args.page_size)]
    # the whole job's cost here, every step of it, before anything runs; refused over an hour
    timing = TimingConfig.for_budget(args.timing_budget_ms, min_reps=ADVISOR_TIMING.min_reps)
    backends, device = get_backends(args.backends), resolve_device(args.device)
    job = Job(tuple(available_here(backends, device)), {w.case().id: (w.phase,) for w in workloads}, timing=timing,
              advisor=True, checks=args.checks)  # availability asked in workers: no backend library loads here
    cost = check_cost([w.case() for w in workloads], device, job, allow=args.allow_expensive)
    print(cost.summary(), file=sys.stderr if args.format == "json" else sys.stdout)
    executor = None
    if args.isolate:  # every backend call in a supervised worker: a crash or hang is a row, not the end
        default, overrides = timeouts(args.call_timeout_s)
        executor = make_executor(resolve_device(args.device), isolate=True, timeout_s=default, timeouts=overrides,
                                 log_dir=str(Path(tempfile.gettempdir()) / "harness-recommend-workers"))
    seed = run_seed(args.seed)
    recorder = _run_folder(args, device, workloads, seed, timing, executor)
    try:
        picks, total = recommend_many(workloads, backends=args.backends, device=args.device, results=args.results,
                                      seed=seed, timing=timing, checks=args.checks,
                                      compile_backend=args.compile_backend, executor=executor,
                                      require=tuple(args.require), progress=True,
                                      weights=step_weights(cost, workloads, backends), record=recorder.record)
    except BaseException:
        recorder.finish(complete=False)
        raise
    finally:
        if executor is not None:
            executor.close()
    from harness.advisor.advice import all_advice, format_advice
    from harness.advisor.frameworks import Target
    from harness.advisor.mix import traffic_mix, weighted
    from harness.store.host import device_name
    mix = traffic_mix(workloads, picks, seed=seed)
    target = Target.parse(args.target) if args.target else Target.of(device)
    advice = all_advice(target, workloads, picks, mix, seed=seed)
    by_mix = weighted(workloads)
    winner = mix.overall.winner if by_mix else total.winner if len(picks) > 1 else next(iter(picks.values())).winner
    measured_on = f"{device} ({device_name(device)})"
    data = advice_json(workloads, picks, total, mix, advice, target, measured_on, winner, by_mix)
    text = ["\n\n".join(format_table(r) for r in picks.values())]
    if len(picks) > 1 and not by_mix:
        text.append("\n" + format_overall(total))
    if len(picks) > 1 or by_mix:
        text.append("\n" + "\n".join(mix.describe()))
    text.append("\n" + format_advice(advice, target, measured_on, tuple(args.for_) or FRAMEWORKS))
    if args.target and target != Target.of(device):
        text.append(f"note: the rules are applied for {target.describe()}, but every figure above was measured on "
                    f"{measured_on}: a ranking measured here says nothing of that device's; measure there")
    elif device.type == "cpu":
        text.append("note: measured on a CPU: a CPU's ranking says nothing of a GPU deployment's (--target sm90 "
                    "applies the frameworks' rules for one; measure on it)")
    recorder.finish_advice("\n".join(text), json.dumps(data, indent=1, default=_plain))
    if args.format == "json":
        print(json.dumps(data, indent=1, default=_plain))
    else:
        print("\n".join(text))
        print(f"run folder: {recorder.run_dir} (advice.txt, advice.json, results.csv; python -m harness report "
              f"{recorder.run_dir})")
    if args.csv:
        frames = [r.table.assign(workload=label) for label, r in picks.items()]
        pd.concat(frames, ignore_index=True).to_csv(args.csv, index=False)
        print(f"table: {args.csv}", file=sys.stderr if args.format == "json" else sys.stdout)
    return 0 if winner else 1


class _AdviceRun:
    """recommend's run folder: the rows it measured (results.csv, samples.csv), env.json, and its advice."""

    def __init__(self, recorder):
        self.recorder, self.run_dir = recorder, recorder.run_dir

    def record(self, rows: list, samples_ms: tuple) -> None:
        self.recorder.write(rows)
        if samples_ms:
            self.recorder.write_samples(rows[0].key, samples_ms, 0)

    def finish_advice(self, text: str, data: str) -> None:
        from harness.store.run_dir import ADVICE_JSON, ADVICE_TEXT
        (self.run_dir / ADVICE_TEXT).write_text(text + "\n")
        (self.run_dir / ADVICE_JSON).write_text(data + "\n")
        self.recorder.finish(complete=True)

    def finish(self, complete: bool) -> None:
        self.recorder.finish(complete=complete)


def _run_folder(args, device, workloads, seed: int, timing, executor) -> _AdviceRun:
    """A run folder under --results-dir, as `check` leaves: `report`, `history` and `compare` read it."""
    from harness.run.recorder import RunRecorder
    from harness.isolation.supervisor import ISOLATED
    from harness.isolation.in_process import UNGUARDED
    from harness.store.environment import environment, new_run_id
    from harness.store.run_dir import results_root
    run_id = new_run_id()
    env = environment(device, timing_mode="cuda-events" if device.type == "cuda" else "cpu-clock")
    env.update(run_id=run_id, rounds=1, device=str(device), seed=seed, command="recommend", benchmark=True,
               integrity=ISOLATED if executor is not None else UNGUARDED, round_timing=vars(timing),
               cases={"case_ids": [w.case().spelled_id for w in workloads]},
               workloads=[{"label": w.label, "case_id": w.case().id, "part": w.role, "calls_weight": w.calls_weight}
                          for w in workloads], backend_modules=list(args.backend_module))
    return _AdviceRun(RunRecorder(run_id, results_root(args.results_dir) / run_id, env))


def _plain(value):
    """json.dumps' fallback: numpy numbers and NaN-able floats as plain numbers (NaN as null)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return None if math.isnan(number) else number


def advice_json(workloads, picks, total, mix, advice, target, measured_on, winner, by_mix) -> dict:
    """`recommend --format json`: every workload's ranking, the overall and mix picks, each framework's advice."""

    def clean(records: list[dict]) -> list[dict]:
        return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in records]

    def mix_pick(p) -> dict:
        return {"part": p.part, "shapes": list(p.shapes), "times_ms": p.times, "winner": p.winner,
                "runner_up": p.runner_up, "ratio": p.ratio, "interval": [p.ratio_low, p.ratio_high],
                "runner_up_ahead": p.runner_up_ahead, "excluded": p.excluded}

    return {"measured_on": measured_on, "rules_for": target.describe(), "winner": winner,
            "overall_by": "weighted time" if by_mix else "rank",
            "workloads": [{"label": w.label, "case_id": w.case().id, "phase": w.phase, "part": w.role,
                           "calls_weight": w.calls_weight, "winner": picks[w.label].winner,
                           "explanation": picks[w.label].explanation,
                           "table": clean(picks[w.label].table.to_dict("records"))} for w in workloads],
            "overall": {"winner": total.winner, "explanation": total.explanation,
                        "table": clean(total.table.to_dict("records"))},
            "mix": {"overall": mix_pick(mix.overall), "parts": {k: mix_pick(v) for k, v in mix.parts.items()},
                    "split": mix.split},
            "frameworks": [a.as_dict() for a in advice]}


def add_subcommand(subparsers: argparse._SubParsersAction) -> None:
    """Add `recommend`: exit 0 with a winner, 1 when no backend is verified and timed, 2 on bad input."""
    p = subparsers.add_parser(
        "recommend",
        help="rank backends for a workload on this machine: correctness, latency with ties, memory, deployment checks",
        description="Verifies every backend on the workload against the float64 reference, times the verified ones "
                    "(fwd, or fwd+bwd with --training), ranks them with ties judged by compare's statistics, and "
                    "runs deployment checks (fullgraph compile on a small shape, CUDA-graph capture, determinism, "
                    "mask path).")
    shape = p.add_argument_group("workload (or --workload FILE)")
    add_to_argparse(shape, "batch")
    shape.add_argument("--heads", type=positive_int, help="query heads")
    shape.add_argument("--kv-heads", type=positive_int,
                       help="key/value heads (GQA when fewer than --heads; default: --heads)")
    add_to_argparse(shape, "seq")
    shape.add_argument("--seq-k", type=positive_int, help="key length (default: --seq)")
    shape.add_argument("--head-dim", type=positive_int)
    shape.add_argument("--dtype", default="bf16", help="fp32, fp16, bf16 or fp64 (default: %(default)s)")
    shape.add_argument("--mask", default=None, help=f"one of {', '.join(MASK_NAMES)}, or windowN (default: causal)")
    shape.add_argument("--training", action="store_true", help="time forward+backward (default: forward only)")
    shape.add_argument("--decode", action="store_true",
                       help="a decode step: one query over --seq cached keys (implied by --spec-len and --page-size)")
    shape.add_argument("--spec-len", type=positive_int, default=None,
                       help="speculative-decoding verification: this many queries over --seq cached keys")
    shape.add_argument("--page-size", type=positive_int, default=None,
                       help="a paged KV cache of pages this size (block table of shuffled pages, cache lengths per "
                            "sequence below --seq; forward only)")
    shape.add_argument("--serving-step", nargs="?", const="p1x512-d31-v4x4", default=None, metavar="MIX",
                       help="a mixed serving step: prefill chunks, decodes and verifications in one batch, each "
                            "sequence with its own query and cache length (caches up to --seq keys; paged with "
                            "--page-size; forward only). MIX reads pPxC-dD-vVxS (default: %(const)s: one 512-token "
                            "chunk, 31 decodes, 4 verifications of 4)")
    shape.add_argument("--workload", type=Path, default=None,
                       help="a .toml (or .yaml with PyYAML) file: [defaults] and [[shape]] tables; one recommendation "
                            "per shape and an overall one")
    p.add_argument("--results", type=Path, default=None,
                   help="a run dir to take the workload's verdicts and samples from when it was measured there on "
                        "this testbed; otherwise they are measured now")
    # the advisor times each backend once, with a larger budget than a suite's key (measure/timing.ADVISOR_TIMING)
    add_to_argparse(shape, "preset", "hf_config")
    add_to_argparse(p, "backends", "backend_module", "device", "seed", "threads", "timing_budget_ms", "no_isolate",
                    "results_dir",
                    "call_timeout_s", "allow_expensive", defaults={"timing_budget_ms": ADVISOR_TIMING.budget_ms})
    p.add_argument("--checks", action=argparse.BooleanOptionalAction, default=True,
                   help="run the deployment checks (--no-checks: correctness and timing only)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the fullgraph check")
    p.add_argument("--require", action="append", default=[], choices=("batch-invariant",),
                   help="exclude backends that do not show this on the workload: batch-invariant = sequence 0's "
                        "output bitwise the same alone and in the workload's batch (repeatable)")
    p.add_argument("--csv", type=Path, default=None, help="also write the table(s) to this CSV")
    p.add_argument("--for", dest="for_", action="append", default=[], choices=FRAMEWORKS,
                   help="end with the setting to paste for this serving framework only (default: all three): the "
                        "fastest measured backend it can run (per prefill/decode for SGLang where they differ), with "
                        "the releases it works in (repeatable)")
    p.add_argument("--target", default=None, metavar="DEVICE",
                   help="apply the frameworks' own rules for this device: cpu, smXY (sm80, sm90, sm100) or X.Y "
                        "(default: the device measured on); the figures stay this machine's")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="json: one JSON document on stdout (rankings, mix, each framework's advice) for automation")
    p.set_defaults(func=_recommend)
