"""harness.suite.plugin with small fakes for pytest's objects: stage order, the parametrization's order and ids,
the run stopping after a backend's KeyboardInterrupt, which cases a session runs, and the summary's counts."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.cases.case import AttentionCase
from harness.cases.matrices import build_matrix
from harness.cases.presets import quick_cases
from harness.store.schema import BWD, FAIL, FWD, FWD_BWD, PASS, PHASES, REJECTED, UNAVAILABLE, Row, figures_comparable
from harness.suite import plugin, summary

ROOT = Path(__file__).resolve().parents[3]
CASES = [AttentionCase(1, 2, 8, 8, "fp32"), AttentionCase(1, 2, 16, 8, "fp32")]
BACKENDS = [SimpleNamespace(name="naive"), SimpleNamespace(name="sdpa")]


def test_items_run_probes_then_correctness_then_benchmark_keeping_their_order_within_a_stage():
    paths = ["suites/benchmark/test_performance.py", "suites/probes/test_semantics.py",
             "suites/correctness/test_correctness.py", "suites/probes/test_decode.py", "tests/unit/test_other.py",
             "suites/correctness/test_correctness.py"]
    items = [SimpleNamespace(path=ROOT / p, n=i) for i, p in enumerate(paths)]
    plugin.pytest_collection_modifyitems(None, None, items)
    assert [i.n for i in items] == [1, 3, 2, 5, 0, 4]


class FakeMetafunc:
    def __init__(self, fixturenames, rounds=1):
        self.fixturenames = fixturenames
        self.config = SimpleNamespace(_harness_cases=CASES, _harness_backends=BACKENDS,
                                      option=SimpleNamespace(rounds=rounds))
        self.calls = []

    def parametrize(self, names, values, ids):
        self.calls.append((names, values, ids))


def test_correctness_is_parametrized_case_major_so_each_reference_is_computed_once():
    metafunc = FakeMetafunc(["case", "backend", "run_session"])
    plugin.pytest_generate_tests(metafunc)
    (names, values, ids), = metafunc.calls
    assert names == ("case", "backend")
    assert [(c.id, b.name) for c, b in values] == [(CASES[0].id, "naive"), (CASES[0].id, "sdpa"),
                                                   (CASES[1].id, "naive"), (CASES[1].id, "sdpa")]
    assert ids[1] == f"sdpa-{CASES[0].id}"


def test_benchmark_rounds_are_round_major_and_the_last_round_keeps_the_plain_id():
    metafunc = FakeMetafunc(["case", "backend", "phase", "perf_round"], rounds=2)
    plugin.pytest_generate_tests(metafunc)
    (names, values, ids), = metafunc.calls
    per_round = len(CASES) * len(BACKENDS) * len(PHASES)
    assert names == ("case", "backend", "phase", "perf_round") and len(values) == 2 * per_round
    assert {r for *_, r in values[:per_round]} == {0} and {r for *_, r in values[per_round:]} == {1}
    assert ids[0] == f"naive-{CASES[0].id}-{FWD}-round1of2"
    assert ids[per_round] == f"naive-{CASES[0].id}-{FWD}"  # what pytest-benchmark stores: independent of --rounds
    assert len(set(ids)) == len(ids)


def test_tests_without_case_and_backend_are_not_parametrized():
    metafunc = FakeMetafunc(["tmp_path"])
    plugin.pytest_generate_tests(metafunc)
    assert metafunc.calls == []


def _item_with(session):
    stash = pytest.Stash()
    if session is not None:
        stash[plugin._SESSION_KEY] = session
    return SimpleNamespace(config=SimpleNamespace(stash=stash), session=SimpleNamespace(shouldstop=False))


def test_the_run_stops_after_the_test_whose_backend_raised_keyboard_interrupt():
    calm = _item_with(SimpleNamespace(executor=SimpleNamespace(interrupted=None)))
    plugin.pytest_runtest_teardown(calm, None)
    assert calm.session.shouldstop is False
    interrupted = _item_with(SimpleNamespace(executor=SimpleNamespace(interrupted="sdpa raised KeyboardInterrupt")))
    plugin.pytest_runtest_teardown(interrupted, None)
    assert interrupted.session.shouldstop == "sdpa raised KeyboardInterrupt"
    plugin.pytest_runtest_teardown(_item_with(None), None)  # no session (collect-only, an xdist worker): nothing


def _option(preset=None, *, matrix="auto", batch=None, seq=None) -> SimpleNamespace:
    return SimpleNamespace(preset=preset, hf_config=None, batch=batch, seq=seq, matrix=matrix)


def test_a_session_runs_the_named_matrix_or_the_presets_cases_but_not_both():
    cpu = torch.device("cpu")
    matrix, cases = plugin.suite_cases(_option(matrix="smoke"), cpu, [])
    assert matrix == "smoke" and [c.id for c in cases] == [c.id for c in build_matrix("smoke")]
    assert plugin.suite_cases(_option(matrix="auto"), cpu, [])[0] == "default"
    matrix, cases = plugin.suite_cases(_option("llama-3-8b", matrix="auto"), cpu, [])
    assert matrix == "model llama-3-8b" and {(c.heads, c.kv_heads, c.head_dim) for c in cases} == {(32, 8, 128)}
    with pytest.raises(ValueError, match="--matrix smoke and --preset/--hf-config both choose the cases; give one"):
        plugin.suite_cases(_option("llama-3-8b", matrix="smoke"), cpu, [])


def test_suites_size_a_model_by_seq_and_batch_as_check_does():
    """pytest suites --preset NAME --seq S --batch B: check's cases of the model at that size (a CPU cannot hold the
    preset's serving sizes: qwen2.5-7b's largest case needs ~34 GiB); --seq alone without a model is refused."""
    cpu = torch.device("cpu")
    option = _option("qwen2.5-7b", batch=1, seq=96)
    matrix, cases = plugin.suite_cases(option, cpu, [])
    assert matrix == "model qwen2.5-7b" and cases == quick_cases("qwen2.5-7b", None, batch=1, seq=96)
    assert {(c.batch, c.seq_k) for c in cases} == {(1, 96)} and {c.seq_q for c in cases} == {1, 96}
    with pytest.raises(ValueError, match="--batch and --seq size the cases of a --preset or --hf-config"):
        plugin.suite_cases(_option(seq=96), cpu, [])


def _perf(case_id, backend, phase, latency_ms, **more):
    return Row(run_id="r", case_id=case_id, backend=backend, phase=phase, latency_ms=latency_ms, **more)


def test_the_summary_counts_cases_by_status_and_gives_the_median_speedup_over_naive_per_phase():
    verdicts = {("c1", "naive"): SimpleNamespace(status=PASS), ("c2", "naive"): SimpleNamespace(status=PASS),
                ("c1", "sdpa"): SimpleNamespace(status=PASS), ("c2", "sdpa"): SimpleNamespace(status=FAIL),
                ("c1", "flash"): SimpleNamespace(status=UNAVAILABLE)}
    perf = {r.key: r for r in [_perf("c1", "naive", FWD, 4.0), _perf("c1", "sdpa", FWD, 1.0),
                               _perf("c2", "naive", FWD, 6.0), _perf("c2", "sdpa", FWD, 2.0),
                               _perf("c1", "naive", BWD, 3.0), _perf("c1", "sdpa", BWD, 1.5)]}
    perf |= {r.key: r for r in [_perf("c2", "sdpa", BWD, None, timing_status=REJECTED,
                                      timing_reason="[bwd, the last call, on new inputs] dq err 0.5 > tol 0.001")]}
    header, naive, sdpa, flash, legend, why, cheat = summary.summary_lines(SimpleNamespace(verdicts=verdicts,
                                                                                        perf_rows=perf))
    columns = header.split()
    assert columns[:9] == ["backend", "pass", "fail", "unsupported", "unavailable", "error", "oom", "rejected",
                           "speedup"]
    assert naive.split()[:8] == ["naive", "2", "0", "0", "0", "0", "0", "0"]
    # sdpa: one pass, one fail, one timing rejected; speedups fwd 4x and 3x (median 3.50), bwd 2x, no fwd+bwd timed
    assert sdpa.split() == ["sdpa", "1", "1", "0", "0", "0", "0", "1", "3.50", "2.00", "-"]
    assert flash.split() == ["flash", "0", "0", "0", "1", "0", "0", "0", "-", "-", "-"]
    assert "rejected:" in legend and why == ("rejected sdpa: 1 timed key(s) refused by the integrity checks, e.g. c2 "
                                             "[bwd]: [bwd, the last call, on new inputs] dq err 0.5 > tol 0.001")
    assert cheat == ("looks like a known cheat: sdpa: answers from an earlier call: right when judged, wrong on the "
                     "timed calls' new inputs (1 row(s), e.g. c2 [bwd])")
    assert header.endswith(f"speedup vs naive {FWD_BWD}") and "speedup vs naive:" in legend
    untimed = summary.summary_lines(SimpleNamespace(verdicts=verdicts, perf_rows={}))
    assert "speedup" not in untimed[0] and len(untimed[1].split()) == 7


def test_a_figure_beyond_the_measured_peak_counts_in_no_speedup():
    """issue 62 item 4: a suspicious row (beyond the measured peak) is shown, never compared: neither as the backend's
    figure nor as naive's (schema.figures_comparable)."""
    verdicts = {(c, b): SimpleNamespace(status=PASS) for c in ("c1", "c2", "c3") for b in ("naive", "sdpa")}
    perf = {r.key: r for r in [_perf("c1", "naive", FWD, 4.0), _perf("c1", "sdpa", FWD, 1.0, suspicious=True),
                               _perf("c2", "naive", FWD, 6.0, suspicious=True), _perf("c2", "sdpa", FWD, 1.0),
                               _perf("c3", "naive", FWD, 3.0), _perf("c3", "sdpa", FWD, 1.5)]}
    sdpa = summary.summary_lines(SimpleNamespace(verdicts=verdicts, perf_rows=perf))[2]
    assert sdpa.split()[-3:] == ["2.00", "-", "-"]  # c3 alone
    assert figures_comparable("timed", False) and not figures_comparable("timed", True)
    assert not figures_comparable(REJECTED, False) and figures_comparable("timed", None)


def test_the_summary_says_when_keys_were_timed_beside_other_load():
    rows = [_perf("c1", "naive", FWD, 1.0, contention=0.1), _perf("c2", "naive", FWD, 1.0, contention=0.7),
            _perf("c3", "naive", FWD, 1.0)]
    assert summary.loaded_lines(rows) == [
        "loaded: 1 of 2 timed key(s) ran while other processes took over 50% of the CPUs (at most 70%; results.csv's "
        "contention column has each key's): their figures carry that load - time them again on a quiet machine "
        "before trusting a speedup"]
    assert summary.loaded_lines(rows[:1]) == []
    # keys timed on several threads: the remedy measured for them too (issue 67 item 3)
    threaded = [_perf("c2", "naive", FWD, 1.0, contention=0.7, threads=2)]
    assert summary.loaded_lines(threaded)[0].endswith(f"; or run with --threads 1 ({summary.THREADS_REMEDY})")


def test_the_progress_weights_are_the_estimates_steps_per_test():
    """issue 48: each test weighs what the cost model estimated for it, so the time left the progress lines project
    is the estimate's: a correctness test its backend's calls (the case's first also its reference), a timing round
    its round, a probe its backend's probes shared among its tests; the session's start goes to the first test."""
    from types import SimpleNamespace

    import torch

    from harness.backends.registry import get_backends
    from harness.planning.cost import Job, job_cost, matrix_cost
    from harness.cases.case import AttentionCase
    from harness.store.schema import FWD, PHASES
    from harness.suite.plugin import _item_weights
    from tests.unit.execution.test_cost import UNITS

    units = UNITS  # round numbers: startup_s 10, session_s 6, probes_s 3
    cases = [AttentionCase(1, 2, 64, 32, "fp32"), AttentionCase(1, 2, 32, 32, "fp32")]
    backends = get_backends(["naive", "sdpa"])
    matrix = matrix_cost(cases, torch.device("cpu"), rate=1e9, baseline_rates={torch.float32: 1e9}, memory=2 ** 30,
                         reference_budget_bytes=2 ** 20, baseline_budget_bytes=2 ** 20)
    cost = job_cost(matrix, Job(tuple(backends), (FWD,), rounds=1, probes=True), units)

    def item(stage: str, **params):
        return SimpleNamespace(path=f"suites/{stage}/test_x.py", callspec=SimpleNamespace(params=params))

    items = ([item("probes", backend=b, question=q) for b in backends for q in ("a", "b")]
             + [item("correctness", case=c, backend=b) for c in cases for b in backends]
             + [item("benchmark", case=c, backend=b, phase=p, perf_round=0) for c in cases for b in backends
                for p in PHASES] + [item("benchmark"), item("benchmark")])
    weights = _item_weights(SimpleNamespace(_harness_cost=cost), items)
    assert weights[0] == pytest.approx(6.0 + 3.0 / 2)  # the session's start, then half of naive's probes
    first = items.index(next(i for i in items if "/correctness/" in i.path))
    assert weights[first] == pytest.approx(cost.seconds_of(cases[0].id, stages=("reference",))
                                           + cost.seconds_of(cases[0].id, "naive", stages=("correctness",)))
    # every step but the command's start-up (over before the tests) is some test's, bwd phases of a fwd-only job
    # and the like at the floor
    floors = sum(w for w, i in zip(weights, items) if i.callspec.params.get("phase") not in (None, FWD))
    assert sum(weights) - floors == pytest.approx(cost.seconds - 10.0)
