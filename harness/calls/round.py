"""One timed round next to the kernel (here or in its worker), as one object whose steps read in the order a round
takes them: built, content no earlier call saw before each call, the call, its answers read inside its timed region,
kept to be judged or not after it, finish; measure() drives the steps, the run judges what finish returns (its side:
run/judge.py, run/audit.py; docs/integrity.md)."""

from __future__ import annotations

import functools
import secrets
from dataclasses import dataclass
from typing import Protocol

import torch

from harness.backends.base import Backend
from harness.calls.bound import BoundCall, backend_inputs, modifier_leaves
from harness.calls.call import leaf_grads, poison
from harness.calls.content import Contents, renewed
from harness.calls.contract import Snapshot, aliased, not_plain
from harness.cases.case import AttentionCase, Inputs
from harness.cases.paged import paged_layout, to_paged
from harness.measure.timing import Timed
from harness.oracle.verdict import bits
from harness.store.schema import BWD, FWD, FWD_BWD, GRADS

#: besides its last call, a round judges JUDGED_DRAWS (k) of its other calls: in a worker on a CPU the run draws them
#: (isolation/brackets.py: a reservoir over the calls it bracketed), elsewhere the round, as each sample returns
#: (selection sampling, Knuth's algorithm S: a sample with r others to come, itself included, is kept with odds
#: (k - kept) / r): every k of them equally likely, only those k copied. A kernel wrong on m of n escapes with odds
#: C(n - m, k) / C(n, k) <= (1 - m/n)^k: wrong on half, 1/4 a round, 1/64 a key (three rounds). Each judged call costs
#: a float64 reference of its own content's slice in the run: 2, not 4 (the main job's judging stage 20.7 s with 4 in
#: one run, 15.5-16.9 s with 2, 2026-12-07)
JUDGED_DRAWS = 2
#: a round's buffers by the Inputs field each holds
INPUT_NAMES = {"q": "q", "k": "k", "v": "v", "dO": "d_out"}


class Ticking(Protocol):
    """The worker's end of the run's bracket of each call (isolation/brackets.py Ticker)."""

    def begin(self) -> None: ...
    def nonce(self) -> int: ...
    def open(self, adjacent: bool = False) -> None: ...
    def close(self, start_ns: int, end_ns: int, sums: dict[str, int]) -> int: ...


def checksum(answer: torch.Tensor) -> torch.Tensor:
    """The sum, wrapping, of an answer's bits read as signed integers of its element's size (oracle.verdict.bits),
    in 32 bits (64 for 8-byte elements): every element read, in any order and layout alike, so the run can recompute
    it on the bytes it receives. A 0-d tensor where the answer lives (on CUDA it is enqueued, not waited for)."""
    # 32 bits, not 64: torch's CPU sum widens element by element, 24x slower on fp32 (1.15 ms for 1M elements, the
    # run's judging and every timed call paid it); a late fill that keeps the sum needs the true answer's sum anyway
    words = bits(answer)
    return torch.sum(words, dtype=torch.int64 if words.element_size() == 8 else torch.int32)


@dataclass(frozen=True)
class Observed:
    """One judged call's answers as they returned (canonical layout, copied as the call returned), the checksums
    taken of them inside the call's own timed region, and which call of its round it was (its content is
    Contents.call(index), which the run makes again from the seed it drew): what the run's process needs to check
    that it judges what was read then (`received`) and to judge it against its own content (run/judge.py)."""

    answers: dict
    sums: dict
    index: int


class TimedRound(Timed):
    """One phase of one case timed: the call is fwd without autograd, bwd the backward alone on a graph built once
    (retained, so every repetition runs the same backward), fwd+bwd a training step. Checked (given the round's
    `contents`, of which `inputs` is the round's own), every estimate call and sample runs on content no earlier
    call had, each answer is read in full inside the call's timed region, JUDGED_DRAWS samples and the last are kept
    to be judged, and what the calls must leave as given is checked; `ticker` (a worker on a CPU): the run brackets
    every estimate call and sample by its own clock and draws the judged ones. Unchecked: the given inputs, nothing
    observed (the memory probe, the advisor's capture check, integrity_overhead's baseline)."""

    def __init__(self, backend: Backend, case: AttentionCase, phase: str, device: torch.device, inputs: Inputs,
                 contents: Contents | None = None, ticker: Ticking | None = None):
        self.backend, self.case, self.phase, self.contents, self.ticker = backend, case, phase, contents, ticker
        self.q, self.k, self.v, self.d_out = backend_inputs(backend, case, inputs, requires_grad=phase != FWD)
        self.leaves = modifier_leaves(inputs, requires_grad=phase != FWD)  # sinks/bias: their gradients are work too
        self.buffers = {"q": self.q, "k": self.k, "v": self.v, "dO": self.d_out, **self.leaves}
        self._forward = functools.partial(BoundCall(backend, case, device, leaves=self.leaves), self.q, self.k, self.v)
        self._built = None
        super().__init__(self._call, self._reset_grads if phase != FWD else None,
                         self._forward_kept if phase == BWD else None)
        # where a call's content goes: the backward alone reads a new dO on the graph it has (its q, k, v stay), the
        # forward alone reads no dO
        self.renewed = tuple(name for name, field in INPUT_NAMES.items() if field in renewed(phase))
        # the buffers are the canonical inputs laid out (a transpose) unless FP8 changes them: a call's content is
        # copied straight into them, one op a buffer, and a paged cache's K or V is scattered into its pages in place
        # (cases.paged.to_paged(into=): the slots no sequence owns keep what they were made with, which the snapshot
        # holds them to; making the cache anew and copying it in was ~60 % of a decode key's round); FP8's inputs
        # are made and copied in
        self.direct = phase == BWD or (case.fp8_kv is None and not case.fp8_q)
        self.pages = paged_layout(case, device) if self.direct and case.page_size is not None else None
        self.paged = tuple(name for name in ("k", "v") if self.pages is not None and name in self.renewed)
        # detached views: written outside autograd without switching grad mode on every call (a leaf's new content is
        # its data, not an operation on it; each call's graph is built after the write)
        self.written = {name: (self.buffers[name] if name in self.paged
                               else backend.from_layout(self.buffers[name])).detach()
                        for name in self.renewed if self.direct}
        # what the calls must leave as given, taken before any (checked rounds)
        self.snapshot = Snapshot(self.buffers) if contents is not None else None
        if ticker is not None:
            ticker.begin()
        self.index = 0  # the call whose content the buffers hold (0: the round's own)
        self.nonce: int | None = None  # its nonce, the run's (None: no ticker)
        #: the samples' answers drawn so far (after_call), as they returned; the last call's after them
        self.drawn: list[Observed] = []
        #: with a ticker the run draws the calls to be judged as each is reported: their answers by the run's slot
        self.slots: dict[int, Observed] = {}
        self._value: object = None  # in_call: the call's value, until close
        self._kept = False  # close: the last call's answers were kept in a slot (after_call poisons its output)
        #: no call ran outside a bracket since the run last read its clocks (the round's first nonce, a report)
        self._adjacent, self._open = True, False
        self.sums: dict[str, torch.Tensor] = {}  # in_call: the last call's answers' checksums
        self.aliased = ""  # after_last_call: '' unless the last call's output is not its own
        self.not_plain = ""  # '' unless a call's output or a drawn answer was a torch.Tensor subclass

    # built: once, before the calls (measure's first step; a CUDA graph captures it instead)

    def _forward_kept(self) -> None:
        """The backward alone's forward, made anew: retain_graph lets every repetition run the same backward."""
        self._built = self._forward()

    # before a call

    def before_call(self) -> None:
        """Content no earlier call had, written into the buffers outside the timed region (Contents)."""
        if self.contents is None:
            return
        self.index += 1
        self.nonce = None if self.ticker is None else self.ticker.nonce()
        self.fresh(self.contents.call(self.index, self.nonce, cast=False))

    def _reset_grads(self) -> None:
        for t in (self.q, self.k, self.v, *self.leaves.values()):
            t.grad = None

    def open(self) -> None:
        """Before the call's clock starts: the run reads its own clock as it lets the call start - on one thread.
        On several, whose CPU time the worker's clock folds in up to a tick late anyway (run/audit.py STALE_MS), a
        call right after a bracketed one is not asked for: its bracket opens at the run's reading of the last
        report, holding this call's content and setup (one round trip a call, not two: the main job's calls cost
        343 us each outside their readings, was 414) - unless the run has asked for every call (a worker kept
        waiting for a CPU: isolation/brackets.py)."""
        if self.ticker is not None:
            self.ticker.open(adjacent=self._adjacent and torch.get_num_threads() > 1)
        self._open = True

    # the call, and its answers read inside its timed region

    def _call(self) -> object:
        if self.phase == FWD:  # as the correctness call runs it: a backend compiled on grad mode compiles once
            with torch.no_grad():
                return self._forward()
        if self.phase == FWD_BWD:
            out = self._forward()
            out.backward(self.d_out)
            return out
        return self._built.backward(self.d_out, retain_graph=True)

    def in_call(self, value: object) -> None:
        """Inside the call's timed region, on every call: each answer read in full (its checksum), so deferred work,
        a lazy fill or a hook that fills memory when it is read costs its time inside the sample; a judged answer's
        copy must still have this checksum when the run receives it (`received`)."""
        if self.contents is None:
            return
        self.sums = {quantity: checksum(answer) for quantity, answer in self.answers(value).items()}
        self._value = value
        self._adjacent = self._adjacent and self._open  # a warm-up call, outside any bracket: the next asks again

    def close(self, start_ns: int, end_ns: int) -> None:
        """After the call's clock stopped: the worker's reading of the call and its answers' checksums go to the run,
        whose clocks read the report's arrival (run/audit.py `bracket_audit`); the run then says whether to keep
        the answers to be judged - its own draw, made once their checksums are with it."""
        self._open = False
        if self.ticker is None:
            return
        self._adjacent = True
        slot = self.ticker.close(start_ns, end_ns, {q: int(s) for q, s in self.sums.items()})
        self._kept = slot >= 0
        if self._kept:
            self.slots[slot] = self._observed(self._value, poisoned=False)
        self._value = None

    # after a call

    def after_call(self, value: object, left: int) -> None:
        """Kept to be judged or not, drawn only now (JUDGED_DRAWS; `left`: the samples after it): no kernel knows;
        with a ticker the run drew as the call was reported (close). Every call's output must be exactly
        torch.Tensor (contract.not_plain)."""
        if self.contents is None:
            return
        self._plain(value, "a timed call")
        if self.ticker is not None:
            if self._kept and isinstance(value, torch.Tensor):
                poison(value)
        elif secrets.randbelow(left) < JUDGED_DRAWS - len(self.drawn):
            self.drawn.append(self._observed(value))

    def after_last_call(self, value: object) -> None:
        """The last call is always judged, and its output must be its own."""
        if self.contents is None:
            return
        self.aliased = aliased(value, self.buffers)
        self._plain(value, "the last timed call")
        self.drawn.append(self._observed(value))

    # finish

    def finish(self, device: torch.device) -> tuple[list[Observed], str]:
        """(the observed calls' answers as they returned, where they ran - a GPU's cross to the run by CUDA IPC - with
        their in-region checksums and indices: run/judge.py checks and judges them in the run's process; the
        integrity problems, '' when none)."""
        if self.contents is None:
            return [], ""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        # what the last call was given, made anew here: the buffers must still hold it
        given = None if self.index == 0 else self.sources(self.contents.call(self.index, self.nonce))
        problems = filter(None, (self.not_plain, self.aliased, self.snapshot.written(given)))
        kept = [self.slots[slot] for slot in sorted(self.slots)] + self.drawn
        observed = [Observed(dict(o.answers), {q: int(s) for q, s in o.sums.items()}, o.index) for o in kept]
        return observed, "; ".join(problems)

    # what the steps read and write: a call's content into the buffers, what they hold, its answers

    def fresh(self, new: Inputs) -> None:
        """Call content written into the buffers it renews (all four; the backward alone: dO, on the graph it has;
        the forward alone: q, k, v); a CUDA graph's static inputs are these buffers."""
        # the renewed inputs may come float32 (Contents.call(cast=False)): a buffer's copy_ casts as .to does
        if not self.direct or self.paged:
            new = new._replace(**{field: getattr(new, field).to(self.case.dtype) for field in renewed(self.phase)})
        if not self.direct:
            with torch.no_grad():
                for name, source in self.sources(new).items():
                    self.buffers[name].copy_(source)
            return
        for name, target in self.written.items():
            if name in self.paged:
                to_paged(getattr(new, name), self.pages, into=target)
            else:
                target.copy_(getattr(new, INPUT_NAMES[name]))

    def sources(self, new: Inputs) -> dict[str, torch.Tensor]:
        """What the renewed buffers hold once `new` is written into them."""
        if self.phase == BWD:
            return {"dO": self.backend.to_layout(new.d_out)}
        made = dict(zip(("q", "k", "v", "dO"), backend_inputs(self.backend, self.case, new, False, copy=False)))
        return {name: made[name] for name in self.renewed}

    def answers(self, value) -> dict[str, torch.Tensor]:
        """What a call returned, by quantity (out, dq, ...), in the canonical layout, not copied."""
        found = {"out": self.backend.from_layout(value.detach())} if isinstance(value, torch.Tensor) else {}
        if self.phase != FWD:  # sinks and bias: canonical in every layout
            found.update((name, self.backend.from_layout(g) if name in GRADS else g)
                         for name, (g, _) in leaf_grads(self.q, self.k, self.v, self.leaves).items())
        return found

    def _plain(self, value: object, what: str) -> None:
        # the first answer that is not exactly torch.Tensor (contract.not_plain) is the round's problem
        if value is not None and type(value) is not torch.Tensor and not self.not_plain:
            self.not_plain = f"{what} {not_plain(value)}"

    def _observed(self, value: object, poisoned: bool = True) -> Observed:
        # copied as the call returned, then the output poisoned: an `empty` of the next call cannot find it
        answers = self.answers(value)
        for quantity, answer in answers.items():
            self._plain(answer, f"a timed call's {quantity}")
        copies = {q: torch.empty_like(a, memory_format=torch.contiguous_format).copy_(a) for q, a in answers.items()}
        if poisoned and isinstance(value, torch.Tensor):
            poison(value)
        return Observed(copies, dict(self.sums), self.index)
