"""The run's judging of a timed round's answers: each as its timed region read it, against the float64 reference of
its own content (made again here from the run's seed), on a slice drawn only after the answer arrived."""

from __future__ import annotations

import contextlib
import secrets

import torch

from harness.calls.cache import LRU
from harness.calls.content import Contents
from harness.calls.round import Observed, checksum
from harness.oracle.prepared import PreparedCase
from harness.measure.limits.roofline import one_thread
from harness.oracle.reference import attended, reference_attention, reference_flops
from harness.cases.case import AttentionCase
from harness.store.schema import BWD, FWD


def received(observed: list, witness=None) -> str:
    """'' when each judged call's answers are, bit for bit, what its timed region read: each answer's checksum is
    recomputed on the bytes that came back and must be the one taken inside the region - as the call's report
    carried it to the run (`witness`, isolation/brackets.Witnessed), or as the worker sent it back (None: no
    brackets); with brackets, the calls that came back must be the ones the run drew and the last it bracketed. An
    answer that changed after its clock stopped (filled late, by a thread or a hook on the harness's own reading) is
    no figure."""
    for i, o in enumerate(observed):
        if not isinstance(o, Observed) or type(o.index) is not int or o.index < 1:
            return f"a timed call's answers came back as {type(o).__name__}, not as observed answers of a call"
    if witness is not None:
        drawn, last = [o.index for o in observed[:-1]], observed[-1].index if observed else None
        if drawn != list(witness.kept) or last != len(witness.brackets):
            return (f"the timed calls that came back to be judged ({drawn}, last {last}) are not the ones the run "
                    f"drew ({list(witness.kept)}, last {len(witness.brackets)})")
    for i, o in enumerate(observed):
        sums = o.sums if witness is None else dict(witness.brackets[o.index - 1].sums)
        for quantity, answer in o.answers.items():
            got, read = int(checksum(answer)), sums.get(quantity)
            if read is None or got != int(read):
                which = "the last timed call" if i == len(observed) - 1 else "a timed call"
                return (f"[{which}] its {quantity} changed after the call's clock stopped (checksum {read} read "
                        f"inside the timed call, {got} received): work left for after the clock")
    return ""


def judged_slice(case: AttentionCase, phase: str) -> tuple[int | None, int]:
    """The (batch, kv head) slice a judged call is checked on, drawn by `secrets` now, after its answer arrived;
    batch None: every batch (the gradients of sinks or a bias sum over the batch)."""
    every = phase != FWD and (case.sinks or case.bias is not None)
    return None if every else secrets.randbelow(case.batch), secrets.randbelow(case.kv_heads)


def part(quantity: str, answer: torch.Tensor, only: tuple[int | None, int], group: int) -> torch.Tensor:
    """The slice `only` of a canonical answer: its query heads for out, dq, dsinks and dbias, its kv head for dk and
    dv; every batch when its batch is None (dbias shared by the batch: its one)."""
    batch, kv_head = only
    heads = slice(kv_head * group, (kv_head + 1) * group) if quantity not in ("dk", "dv") else slice(kv_head,
                                                                                                    kv_head + 1)
    if quantity == "dsinks":
        return answer[heads]
    batches = slice(None) if batch is None or (quantity == "dbias" and answer.shape[0] == 1) else slice(batch,
                                                                                                       batch + 1)
    return answer[batches, heads]


#: a slice's float64 reference of at least this many FLOPs takes every CPU thread; smaller ones (and the comparisons)
#: one: the workers' OpenMP threads still spin after a call, and the default run's timed judging - then comparisons
#: alone - took 5.6 s on two threads, 1.1 s on one (2-core VM, 984 rounds)
THREADED_FLOPS = 2e7


def threads_for(flops: float, device: torch.device):
    """One thread on a CPU for work under THREADED_FLOPS, the process's own otherwise (and on a GPU)."""
    return one_thread() if torch.device(device).type == "cpu" and flops < THREADED_FLOPS else contextlib.nullcontext()


def judge_timed(backend_name: str, prepared: PreparedCase, phase: str, observed: list, seed: int,
                witness=None, pools: LRU | None = None) -> str:
    """'' when every timed call's answer that came back (round.Observed) was what its timed region read and is
    within the tolerance of the float64 reference of that call's own content (content.Contents from `seed`, the round's,
    drawn by this process; its pools kept in `pools` where given) on a (batch, kv head) slice drawn after it arrived
    (never bitwise); else the first failure, naming the call, the quantity and the slice. A kernel wrong on a share f of
    a call's slices escapes one judged call with odds 1 - f; an answer of other content (a cache, a re-scaled earlier
    answer) is wrong on every slice."""
    if not observed:
        return "nothing the timed calls returned came back to be judged"
    case = prepared.case
    # the answers' sums and the contents' draws on one thread: on two (beside a worker's spinning OpenMP threads)
    # the sums alone took 7.4 s of the main job, 0.2 s on one
    with threads_for(0.0, prepared.device):
        if problem := received(observed, witness):
            return problem
        contents = Contents(case, phase, seed, prepared.device, *prepared.modifiers(), pools=pools)
    group = case.heads // case.kv_heads
    quantities = (["out"] if phase != BWD else []) + (list(case.grads) if phase != FWD else [])
    for i, o in enumerate(observed, 1):
        which = f"[{phase}, {'the last' if i == len(observed) else 'a'} timed call, on content no earlier call saw]"
        missing = [quantity for quantity in quantities if o.answers.get(quantity) is None]
        if missing:
            return f"{which} returned no {missing[0]}"
        only = judged_slice(case, phase)
        content = contents.call(o.index, None if witness is None else witness.nonces[o.index - 1])
        slices = case.kv_heads * (1 if only[0] is None else case.batch)
        with threads_for(reference_flops(case, phase != FWD) / slices, prepared.device):
            reference = reference_attention(case, attended(case, content), grads=phase != FWD, only=only)
            reference = reference.to(prepared.reference.out.device)  # judged where the case's own is (placement.py)
        with threads_for(0.0, prepared.device):
            checks = [prepared.judged(quantity, part(quantity, o.answers[quantity], only, group), backend_name,
                                      reference=reference) for quantity in quantities]
        failed = next((check for check in checks if not check.passed), None)
        if failed is not None:
            batch = "every batch" if only[0] is None else f"batch {only[0]}"
            return f"{which} {failed.describe()} ({batch}, kv head {only[1]})"
    return ""
