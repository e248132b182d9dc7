"""The shrinker on synthetic failures (a predicate stands in for a backend): smallest case, steps, bounds."""

from dataclasses import replace

import torch

from harness.backends.naive import Naive
from harness.fuzzing.shrink import Signature, Trials, failed_checks, shrink, signature
from harness.calls.outcome import BackendResult
from harness.fuzzing.space import Knobs, build
from harness.store.schema import Row

FWD_OUT = Signature("fwd", "fail", "out")


class Predicate(Trials):
    """Trials whose 'backend' fails exactly the cases `fails` says, with the check FWD_OUT."""

    def __init__(self, fails):
        super().__init__(Naive(), torch.device("cpu"), 0, executor=None)
        self.fails = fails

    def checks(self, case):
        self.count += 1
        return (FWD_OUT,) if self.fails(case) else ()


BIG = Knobs("bf16", batch=6, kv_heads=3, group=3, seq_q=700, seq_k=1500, head_dim=80, layout="dense",
            structure="window", padded=True, window=(40, 0), pad=(1500, 900, 3, 0, 1500, 70, 2, 1), softcap=20.0)


def test_a_geometry_bug_shrinks_to_its_trigger_and_records_its_steps():
    bug = Predicate(lambda c: c.heads // c.kv_heads == 3 and c.kv_heads >= 2 and c.head_dim == 80)
    shrunk = shrink(BIG, FWD_OUT, bug, deadline=float("inf"))
    assert shrunk.case == build(Knobs("fp32", 1, 2, 3, 1, 1, 80)) and not shrunk.stopped
    assert shrunk.steps[:3] == ("seq_k 1500 -> 1", "seq_q 700 -> 1", "batch 6 -> 1")     # the big cuts first
    assert "fp32" in shrunk.steps and "kv_heads 3 -> 2" in shrunk.steps
    again = shrink(BIG, FWD_OUT, Predicate(bug.fails), deadline=float("inf"))
    assert again == shrunk                                              # deterministic


def test_a_size_threshold_is_found_by_binary_search():
    shrunk = shrink(BIG, FWD_OUT, Predicate(lambda c: c.seq_k >= 129), deadline=float("inf"))
    assert shrunk.case.seq_k == 129 and shrunk.case.seq_q == 1 and shrunk.case.batch == 1
    assert shrunk.trials < 80


def test_a_long_case_is_halved_first_so_few_trials_run_at_its_drawn_size():
    tried = []
    bug = Predicate(lambda c: tried.append(c) or (c.head_dim == 80 and c.seq_k >= 2))        # any length past 1 key
    shrunk = shrink(BIG, FWD_OUT, bug, deadline=float("inf"))
    assert shrunk.case == build(Knobs("fp32", 1, 1, 1, 1, 2, 80)) and shrunk.trials < 50
    assert sum(c.seq_q * c.seq_k >= 700 * 750 for c in tried) <= 2                 # seq_k to 1 (passes), to 750
    assert shrunk.steps[1] == "seq_q 700 -> 1" and "seq_k 5 -> 2" in shrunk.steps


def test_the_bounds_stop_it_and_say_which():
    clock = iter(range(100)).__next__
    stopped = shrink(BIG, FWD_OUT, Predicate(lambda c: True), deadline=3, clock=clock)
    assert stopped.stopped == "time bound" and len(stopped.steps) <= 3


def test_the_checks_failed_name_the_phase_status_and_each_quantity_past_tolerance():
    rows = [Row(run_id="r", case_id="c", backend="b", phase="fwd", status="pass", out_err=1.0, out_tol=2.0),
            Row(run_id="r", case_id="c", backend="b", phase="bwd", status="fail", dq_err=1.0, dq_tol=2.0,
                dk_err=3.0, dk_tol=2.0, dv_err=float("nan"), dv_tol=1.0)]
    assert failed_checks(BackendResult(rows)) == (Signature("bwd", "fail", "dk"), Signature("bwd", "fail", "dv"))
    rows[1] = replace(rows[1], status="error", reason="RuntimeError: shapes")
    assert signature(BackendResult(rows)) == Signature("bwd", "error", "RuntimeError")
    assert signature(BackendResult(rows[:1])) is None and failed_checks(BackendResult(rows[:1])) == ()


def test_a_drawn_case_moved_toward_a_known_failure_fails_there_only_when_it_is_the_same_bug():
    from harness.fuzzing.space import toward
    bugs = Predicate(lambda c: (c.batch == 1 and c.seq_k >= 2) or (c.heads // c.kv_heads == 3 and c.kv_heads >= 2))
    known = shrink(replace(BIG, batch=1, group=1), FWD_OUT, bugs, deadline=float("inf"))
    assert known.case.batch == 1 and known.case.heads == known.case.kv_heads
    same = toward(replace(BIG, batch=1, head_dim=40), known.knobs, known.steps)
    assert bugs.fails(build(same)) and build(same).seq_k == 2             # a single sequence still: the same bug
    moved = build(toward(BIG, known.knobs, known.steps))                   # batch 6, group 3: another bug
    assert moved.batch == 2 and not bugs.fails(moved)                      # not moved onto the single sequence


def test_two_bugs_in_one_case_are_two_failures_the_second_shrunk_outside_the_firsts_trigger():
    from harness.fuzzing.shrink import inside, needs_one
    bugs = Predicate(lambda c: (c.batch == 1 and c.seq_k >= 2) or (c.head_dim == 80 and c.seq_k >= 2))
    first = shrink(BIG, FWD_OUT, bugs, deadline=float("inf"))                   # batch 6, d80: slips to batch 1
    assert first.case == build(Knobs("fp32", 1, 1, 1, 1, 2, 1))
    pins = needs_one(first.knobs, FWD_OUT, bugs)
    assert pins == {"batch": 1} and not inside(BIG, pins)                       # BIG fails for another reason too
    second = shrink(BIG, FWD_OUT, bugs, deadline=float("inf"), avoid=(pins,))
    assert second.case == build(Knobs("fp32", 2, 1, 1, 1, 2, 80))               # one row past the other trigger


def test_a_drawn_case_moves_toward_a_known_failure_only_when_it_has_that_failures_sizes_above_2():
    from harness.fuzzing.fuzz import _shares_sizes
    d80 = Knobs("fp32", 2, 1, 1, 1, 2, 80)                   # moving head dim 96 to 80 would plant that bug in it
    assert _shares_sizes(replace(BIG, head_dim=80), d80) and not _shares_sizes(replace(BIG, head_dim=96), d80)


def test_a_shrink_held_off_a_known_failures_case_by_another_trigger_is_that_failure():
    """Fuzz seed 2 of the planted plugin listed its group-of-3 bug twice: smallest at batch 1 with one key (outside
    the batch-1 bug's trigger, which needs two keys) and, from a drawn case of batch 2 kept out of batch 1, at batch
    2. The second is the first held off by the batch-1 trigger: one failure. Two bugs stay two."""
    from harness.fuzzing.fuzz import Finding, held_off
    from harness.fuzzing.shrink import needs_one
    bugs = Predicate(lambda c: (c.batch == 1 and c.seq_k >= 2) or (c.heads // c.kv_heads == 3 and c.kv_heads >= 2))
    single = shrink(replace(BIG, group=1, head_dim=16), FWD_OUT, bugs, deadline=float("inf"))
    pins = needs_one(single.knobs, FWD_OUT, bugs)
    group = shrink(replace(BIG, batch=1, seq_k=1, seq_q=1, structure="none", padded=False, pad=(), window=None),
                   FWD_OUT, bugs, deadline=float("inf"))
    assert pins == {"batch": 1} and group.case.batch == 1 and group.case.seq_k == 1
    known = [Finding("b", FWD_OUT, single, "", pins), Finding("b", FWD_OUT, group, "")]
    held = shrink(BIG, FWD_OUT, bugs, deadline=float("inf"), avoid=(pins,))
    assert held.case.batch == 2 and held.case.heads // held.case.kv_heads == 3
    assert held_off(held.knobs, (pins,), known, FWD_OUT) is known[1]
    d80 = Predicate(lambda c: (c.batch == 1 and c.seq_k >= 2) or (c.head_dim == 80 and c.seq_k >= 2))
    other = shrink(BIG, FWD_OUT, d80, deadline=float("inf"), avoid=(pins,))           # batch 2, d80: a second bug
    assert held_off(other.knobs, (pins,), known, FWD_OUT) is None
