"""The pytest plugin behind `pytest suites`: options, parametrization, stage order, the run session, the summary."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from harness.advisor.progress import Progress
from harness.backends.registry import get_backends
from harness.isolation.plugin_host import load_backend_module
from harness.cli.backends import available_here
from harness.cli.options import add_to_pytest
from harness.calls.device import resolve_device
from harness.fuzzing.fuzz import plan
from harness.run.session import run_seed
from harness.run.session import RunSession
from harness.launch.sharding import parse_shard, select_shard
from harness.measure import stages
from harness.measure.timing import TimingConfig
from harness.planning.cost import Job, check_cost
from harness.cases.matrices import AUTO, FUZZ, build_matrix, resolve_matrix
from harness.cases.presets import model_shape, quick_cases
from harness.suite.probes import tier
from harness.store.run_dir import results_root
from harness.store.schema import PHASES
from harness.suite.summary import summary_lines

_SESSION_KEY = pytest.StashKey[RunSession]()
_PROGRESS_KEY = pytest.StashKey[Progress]()
#: stage name -> (its tests done, its tests), for the progress lines
_STAGE_COUNTS_KEY = pytest.StashKey[dict]()
#: a long run says where it is at most this often (and at a stage's end once it has run this long)
PROGRESS_EVERY_S = 30.0
#: suites/<stage>/test_*.py run in this order: the probes first, so the prefetcher compiles correctness graphs
#: beside them; the benchmark last: it times only what correctness passed, with nothing compiling beside it
STAGES = ("probes", "correctness", "benchmark")
#: each stage index's name (_stage), any other test last
_NAMES = (*STAGES, "other tests")


def pytest_addoption(parser):
    group = parser.getgroup("attention harness")
    add_to_pytest(group, "backends", "backend_module", "matrix", "fuzz_budget_s", "preset", "hf_config", "batch",
                  "seq", "allow_expensive", "device", "results_dir", "seed", "benchmark", "timing_budget_ms", "rounds",
                  "cuda_graph", "threads", "cpu_mem_budget_gb", "no_report", "shard", "no_isolate", "call_timeout_s")


def pytest_configure(config):
    main = getattr(config, "workerinput", None) is None and not config.option.collectonly  # not xdist's, not collect
    try:
        for module in config.option.backend_module:
            load_backend_module(module, here=not config.option.isolate)  # imported here only with --no-isolate
        config._harness_backends = get_backends(config.option.backends)
        device = resolve_device(config.option.device)
        config._harness_matrix, config._harness_cases = suite_cases(config.option, device,
                                                                    config._harness_backends)
        if config.option.shard:
            config._harness_cases = select_shard(config._harness_cases, *parse_shard(config.option.shard))
        results_root(config.option.results_dir)
        # with -k/-m the cases selected are known after collection: the refusal waits for them (_refuse_selected)
        config._harness_cost = (check_cost(config._harness_cases, device, suite_job(config, device),
                                           allow=config.option.allow_expensive or _narrowed(config))
                                if main else None)
    except (ValueError, FileNotFoundError) as exc:
        raise pytest.UsageError(str(exc)) from None
    if config.option.threads is not None:
        torch.set_num_threads(config.option.threads)  # fixed for the whole run, recorded in env and rows
    if main:
        try:
            session = RunSession.from_options(config.option, device, config._harness_cases, config._harness_matrix)
        except ValueError as exc:  # e.g. started in one checkout with another's harness (store/environment.py)
            raise pytest.UsageError(str(exc)) from None
        config.stash[_SESSION_KEY] = session
        if config.getoption("benchmark_storage", None) == "file://./.benchmarks":
            # pytest-benchmark's own --benchmark-compare must only compare like with like: one store per testbed
            config.option.benchmark_storage = f"file://./.benchmarks/{session.env['testbed_id']}"
        _readable_benchmark_table(config)
        _quiet_benchmark_table(config)
    config._harness_device = device


def suite_cases(option, device, backends) -> tuple[str, list]:
    """(what the cases are, the cases): a model preset or HF config when given - at --seq/--batch when either is
    given, as `check` sizes them, else at the model's serving sizes - else the named matrix, or with --matrix fuzz
    cases drawn for `backends` from --seed (fixed here: the run records it) within --fuzz-budget-s."""
    sized = quick_cases(option.preset, option.hf_config, batch=option.batch, seq=option.seq)
    shape = model_shape(option.preset, option.hf_config)
    if shape is not None:
        if option.matrix != AUTO:
            raise ValueError(f"--matrix {option.matrix} and --preset/--hf-config both choose the cases; give one")
        given = option.batch is not None or option.seq is not None
        return f"model {shape.name}", sized if given else shape.cases()
    matrix = resolve_matrix(option.matrix, device.type)
    if matrix == FUZZ:
        option.seed = run_seed(option.seed)
        here = available_here(backends, device)  # asked in workers: no backend library loads here
        return matrix, [p.case for p in plan(here, device, option.seed, option.fuzz_budget_s)]
    return matrix, build_matrix(matrix)


def _narrowed(config) -> bool:
    """Whether -k or -m selects among the matrix's tests (the whole matrix's estimate is then not the run's)."""
    return bool(getattr(config.option, "keyword", "") or getattr(config.option, "markexpr", ""))


def _refuse_selected(session) -> None:
    """With -k/-m: the estimate of the cases the selected tests run, refused over an hour as the whole run's is."""
    config = session.config
    if not _narrowed(config) or config.option.allow_expensive:
        return
    cases = list(dict.fromkeys(p["case"] for p in (getattr(getattr(i, "callspec", None), "params", {})
                                                   for i in session.items) if p.get("case") is not None))
    if not cases:
        return
    try:
        config._harness_cost = check_cost(cases, config._harness_device, suite_job(config, config._harness_device),
                                          allow=False)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def suite_job(config, device) -> Job:
    """What this run does besides the references (the cost model's Job): the probes where their tier runs, every
    available backend's correctness calls, and with --benchmark every phase's --rounds rounds at the run's budget."""
    option = config.option
    timing = TimingConfig.for_budget(option.timing_budget_ms, cuda_graph=option.cuda_graph)
    here = available_here(config._harness_backends, device)  # asked in workers: no backend library loads here
    return Job(tuple(here), PHASES if option.benchmark_enabled else (), option.rounds, timing,
               probes=tier(config) is not None)


def pytest_report_header(config):
    """What the run will cost the harness itself, estimated before it starts (planning/cost.py)."""
    cost = getattr(config, "_harness_cost", None)
    return [f"attention harness: {config._harness_matrix} on {config._harness_device}",
            *([] if cost is None else ["attention harness: " + cost.summary()])]


def _readable_benchmark_table(config) -> None:
    """pytest-benchmark's table, where the user left its defaults: the columns the harness measures, in ms."""
    option = config.option
    if not hasattr(option, "benchmark_columns"):  # pytest-benchmark not loaded (-p no:benchmark)
        return
    if option.benchmark_columns is None:  # pytest-benchmark resolves None to its long default list
        option.benchmark_columns = ["median", "iqr", "min", "max", "rounds"]
    if option.benchmark_time_unit is None:
        option.benchmark_time_unit = "ms"


def _quiet_benchmark_table(config) -> None:
    """pytest-benchmark's own tables (ratios the other way from ours) only when a --benchmark-* option asks."""
    if hasattr(config.option, "benchmark_quiet") and not any(
            str(a).startswith("--benchmark-") for a in config.invocation_params.args):
        config.option.benchmark_quiet = True


def _stage(item) -> int:
    parts = Path(str(item.path)).parts
    return next((i for i, stage in enumerate(STAGES) if stage in parts), len(STAGES))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Record the stage the run is in, then add the test's wall time to its stage's total and count it."""
    start = time.perf_counter()
    session = item.config.stash.get(_SESSION_KEY, None)
    name = _NAMES[_stage(item)]
    if session is not None:
        session.enter_stage(name)
    try:
        return (yield)
    finally:
        if session is not None:
            session.recorder.add_test_seconds(name, time.perf_counter() - start)
        _progress(item, nextitem, name)


def _progress(item, nextitem, stage: str) -> None:
    """Count the test done; a progress line every PROGRESS_EVERY_S, and at a stage's end once the run is that long."""
    progress = item.config.stash.get(_PROGRESS_KEY, None)
    if progress is None:
        return
    counts = item.config.stash[_STAGE_COUNTS_KEY]
    done, total = counts.get(stage, (0, 0))
    counts[stage] = (done + 1, total)
    boundary = nextitem is None or _stage(nextitem) != _stage(item)
    progress.step(f"{stage} stage, {done + 1}/{total} of its tests",
                  force=boundary and progress.clock() - progress.start >= PROGRESS_EVERY_S)


def _item_weights(config, items) -> list[float]:
    """Each test's expected seconds by the cost model's steps (the estimate the header printed): a correctness test
    carries its case's reference and baseline when it is the case's first, a timing round its round, a probe its
    backend's probes stage shared among that backend's probe tests; the session's start is the first test's."""
    cost = getattr(config, "_harness_cost", None)
    if cost is None:
        return [1.0] * len(items)
    params = [getattr(getattr(item, "callspec", None), "params", {}) for item in items]
    names = [_NAMES[_stage(item)] for item in items]
    # a probe suite that is off has one placeholder test whose backend is None
    probes = Counter(p["backend"].name for p, n in zip(params, names) if n == "probes" and p.get("backend"))
    first_of_case: set = set()
    weights = []
    for item, p, name in zip(items, params, names):
        case, backend = p.get("case"), p.get("backend")
        if name == "probes" and backend is not None:
            seconds = cost.seconds_of("probes", backend.name) / probes[backend.name]
        elif name == "correctness" and case is not None and backend is not None:
            seconds = cost.seconds_of(case.id, backend.name, stages=("correctness", "compile"))
            if case.id not in first_of_case:
                first_of_case.add(case.id)
                seconds += cost.seconds_of(case.id, stages=("reference",))
        elif name == "benchmark" and "perf_round" in p:
            seconds = cost.seconds_of(case.id, backend.name, p["phase"], p["perf_round"])
        elif name == "benchmark":
            seconds = cost.seconds_of("fidelity") / 2  # the timing fidelity and the reference-scale tests
        else:
            seconds = 0.0
        weights.append(seconds)
    weights[0] += cost.seconds_of("session")  # the first test's setup starts the session's workers
    return [max(w, 0.01) for w in weights]  # a skip or a refusal still takes a moment


def pytest_collection_modifyitems(session, config, items):
    """The probes, then correctness, then the benchmark (STAGES); the order inside a stage is kept (stable sort)."""
    items.sort(key=_stage)


def pytest_collection_finish(session):
    """The progress lines' counts and weights, made once the items are known; the prefetcher's calls."""
    run = session.config.stash.get(_SESSION_KEY, None)
    if run is None or not session.items:
        return
    _refuse_selected(session)
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    progress = Progress(len(session.items), weights=_item_weights(session.config, session.items),
                        estimated=getattr(session.config, "_harness_cost", None) is not None,
                        every_s=PROGRESS_EVERY_S,
                        say=None if tr is None else lambda line: tr.write(f"\nattention harness: {line}\n"))
    names = [_NAMES[i] for i in map(_stage, session.items)]
    session.config.stash[_STAGE_COUNTS_KEY] = {name: (0, names.count(name)) for name in dict.fromkeys(names)}
    session.config.stash[_PROGRESS_KEY] = progress
    # flex's correctness graphs compile on the second core while this one runs the probes (run/prefetch.py)
    run.compile_ahead([(item.callspec.params["case"], item.callspec.params["backend"]) for item in session.items
                       if item.originalname == "test_correctness"])


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames and "backend" in metafunc.fixturenames:
        config = metafunc.config
        # case-major order: the reference of a case is computed once and reused by every backend
        pairs = [(c, b) for c in config._harness_cases for b in config._harness_backends]
        if "phase" in metafunc.fixturenames and "perf_round" in metafunc.fixturenames:
            # round-major: every key's first round, then every key's second... so the rounds of one key are
            # minutes apart and a transient (another process, a clock dip) hits at most one of them
            rounds = config.option.rounds
            quads = [(c, b, p, r) for r in range(rounds) for c, b in pairs for p in PHASES]
            metafunc.parametrize(("case", "backend", "phase", "perf_round"), quads,
                                 # the last round keeps the plain id: it is the one pytest-benchmark records, so
                                 # its stored names do not depend on --rounds
                                 ids=[f"{b.name}-{c.id}-{p}" + (f"-round{r + 1}of{rounds}" if r < rounds - 1 else "")
                                      for c, b, p, r in quads])
        else:
            metafunc.parametrize(("case", "backend"), pairs, ids=[f"{b.name}-{c.id}" for c, b in pairs])


def pytest_runtest_teardown(item, nextitem):
    """After a backend's KeyboardInterrupt (its row written) the run stops, as after a Ctrl-C."""
    session = item.config.stash.get(_SESSION_KEY, None)
    if session is not None and session.executor.interrupted:
        item.session.shouldstop = session.executor.interrupted


@pytest.fixture
def write_probe(request, run_session):
    """Writes a probe test's rows, each failing one with the command that reruns this test alone
    (RunSession.write_probe); returns the rows as written."""
    return lambda rows: run_session.write_probe(list(rows), request.node.nodeid, request.config._harness_matrix)


@pytest.fixture(scope="session")
def run_session(request) -> RunSession:
    session = request.config.stash.get(_SESSION_KEY, None)
    if session is None:
        pytest.skip("no run session (collect-only or xdist worker)")
    return session


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The harness's summary after every other plugin's (docs/design/execution.md), and the run's finish."""
    result = yield
    session = config.stash.get(_SESSION_KEY, None)
    if session is None:
        return result
    complete = exitstatus != pytest.ExitCode.INTERRUPTED and not session.executor.interrupted
    if not session.verdicts:
        session.finish(complete=complete)
        return result
    tr = terminalreporter
    tr.section("attention harness")
    tr.write_line(f"integrity: {session.executor.integrity}")
    for line in summary_lines(session):
        tr.write_line(line)
    session.finish(complete=complete)
    for line in stages.time_lines(session.env["time_spent"]):
        tr.write_line(line)
    tr.write_line(f"results: {session.writer.path}")
    if config.getoption("report", True):
        try:  # figures and report are built from the stored files only; a drawing problem must not fail the run
            from harness.report.document import build_report
            tr.write_line(f"report:  {build_report(session.run_dir)}")
        except Exception as exc:
            tr.write_line(f"report:  not built ({type(exc).__name__}: {exc}); retry with "
                          f"python -m harness report {session.run_dir}")
    return result
