"""A timed round's integrity where its calls run (docs/integrity.md): fresh content on every call, each answer read
inside its timed region, the checks of what the calls did (RoundGuard); the run's side is run/audit.py and judge.py."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from harness.calls.cache import LRU
from harness.calls.call import poison
from harness.calls.content import Contents
from harness.calls.contract import Snapshot, aliased, not_plain
from harness.measure.timing import Guard
from harness.oracle.verdict import bits
from harness.cases.case import Inputs



class Watched(Protocol):
    """What a RoundGuard needs of the phase it watches (timed.Phase is one): the call's buffers by name, how a call's
    content is written into them, what they hold for given inputs, and a call's answers by quantity."""

    buffers: dict[str, torch.Tensor]
    fresh: Callable[[Inputs], None] | None
    sources: Callable[[Inputs], dict[str, torch.Tensor]] | None
    answers: Callable[[object], dict[str, torch.Tensor]] | None

class Ticking(Protocol):
    """The worker's end of the run's bracket of each call (isolation/brackets.py Ticker)."""

    def begin(self) -> None: ...
    def nonce(self) -> int: ...
    def open(self, adjacent: bool = False) -> None: ...
    def close(self, start_ns: int, end_ns: int, sums: dict[str, int]) -> int: ...


#: besides its last call, a round judges JUDGED_DRAWS (k) of its other calls: in a worker on a CPU the run draws them
#: (isolation/brackets.py: a reservoir over the calls it bracketed), elsewhere the worker, as each sample returns
#: (selection sampling, Knuth's algorithm S: a sample with r others to come, itself included, is kept with odds
#: (k - kept) / r): every k of them equally likely, only those k copied. A kernel wrong on m of n escapes with odds
#: C(n - m, k) / C(n, k) <= (1 - m/n)^k: wrong on half, 1/4 a round, 1/64 a key (three rounds). Each judged call costs
#: a float64 reference of its own content's slice in the run: 2, not 4 (the main job's judging stage 20.7 s with 4 in
#: one run, 15.5-16.9 s with 2, 2026-12-07)
JUDGED_DRAWS = 2
#: a phase's buffers by the Inputs field each holds
INPUT_NAMES = {"q": "q", "k": "k", "v": "v", "dO": "d_out"}


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


class RoundGuard(Guard):
    """A timed round's integrity where its calls run: the one entry every clock path (timing.measure: CPU clock, CUDA
    events, CUDA graph replays) calls, in named steps - before_call before every estimate call and sample (warm-up calls
    repeat the content before them: timing.WARMUP_RENEWS), in_call inside every call's timed region, after_call after
    each sample but the last, after_last_call after the last - then finish; open and close bracket every estimate
    call and sample by the run's clock where a ticker is given (a worker)."""

    def __init__(self, case, phase: str, seed: int, verified: Inputs, ticker: Ticking | None = None,
                 pools: LRU | None = None):
        # the seed is the run's (TimingCall.seed): the run makes any call's content again to judge it
        self.contents = Contents(case, phase, seed, verified.q.device, verified.sinks, verified.bias, pools)
        #: the run's clock around each estimate call and sample (isolation/brackets.py Ticker); None: in-process
        self.ticker = ticker
        if ticker is not None:
            ticker.begin()
        #: the round's own content, which the phase is built on (the backward alone's graph: q, k and v)
        self.inputs = self.contents.round
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

    def watch(self, timed: Watched) -> None:
        """The phase built on `inputs`: what its calls must leave as given is taken now."""
        self.timed, self.snapshot = timed, Snapshot(timed.buffers)

    def before_call(self) -> None:
        """Content no earlier call had, written into the buffers outside the timed region (Contents)."""
        self.index += 1
        self.nonce = None if self.ticker is None else self.ticker.nonce()
        self.timed.fresh(self.contents.call(self.index, self.nonce, cast=False))

    def open(self) -> None:
        """Before the call's clock starts: the run reads its own clock as it lets the call start - on one thread.
        On several, whose CPU time the worker's clock folds in up to a tick late anyway (run/audit.py STALE_MS), a
        call right after a bracketed one is not asked for: its bracket opens at the run's reading of the last
        report, holding this call's content and setup (one round trip a call, not two: the main job's calls cost
        343 us each outside their readings, was 414)."""
        if self.ticker is not None:
            self.ticker.open(adjacent=self._adjacent and torch.get_num_threads() > 1)
        self._open = True

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

    def in_call(self, value: object) -> None:
        """Inside the call's timed region, on every call: each answer read in full (its checksum), so deferred work,
        a lazy fill or a hook that fills memory when it is read costs its time inside the sample; a judged answer's
        copy must still have this checksum when the run receives it (`received`)."""
        self.sums = {quantity: checksum(answer) for quantity, answer in self.timed.answers(value).items()}
        self._value = value
        self._adjacent = self._adjacent and self._open  # a warm-up call, outside any bracket: the next asks again

    def after_call(self, value: object, left: int) -> None:
        """Kept to be judged or not, drawn only now (JUDGED_DRAWS; `left`: the samples after it): no kernel knows;
        with a ticker the run drew as the call was reported (close). Every call's output must be exactly
        torch.Tensor (contract.not_plain)."""
        self._plain(value, "a timed call")
        if self.ticker is not None:
            if self._kept and isinstance(value, torch.Tensor):
                poison(value)
        elif secrets.randbelow(left) < JUDGED_DRAWS - len(self.drawn):
            self.drawn.append(self._observed(value))

    def after_last_call(self, value: object) -> None:
        """The last call is always judged, and its output must be its own."""
        self.aliased = aliased(value, self.timed.buffers)
        self._plain(value, "the last timed call")
        self.drawn.append(self._observed(value))

    def _plain(self, value: object, what: str) -> None:
        # the first answer that is not exactly torch.Tensor (contract.not_plain) is the round's problem
        if value is not None and type(value) is not torch.Tensor and not self.not_plain:
            self.not_plain = f"{what} {not_plain(value)}"

    def _observed(self, value: object, poisoned: bool = True) -> Observed:
        # copied as the call returned, then the output poisoned: an `empty` of the next call cannot find it
        answers = self.timed.answers(value)
        for quantity, answer in answers.items():
            self._plain(answer, f"a timed call's {quantity}")
        copies = {q: torch.empty_like(a, memory_format=torch.contiguous_format).copy_(a) for q, a in answers.items()}
        if poisoned and isinstance(value, torch.Tensor):
            poison(value)
        return Observed(copies, dict(self.sums), self.index)

    def finish(self, device: torch.device) -> tuple[list[Observed], str]:
        """(the observed calls' answers as they returned, where they ran - a GPU's cross to the run by CUDA IPC - with
        their in-region checksums and indices: run/judge.py checks and judges them in the run's process; the
        integrity problems, '' when none)."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        # what the last call was given, made anew here: the buffers must still hold it
        given = None if self.index == 0 else self.timed.sources(self.contents.call(self.index, self.nonce))
        problems = filter(None, (self.not_plain, self.aliased, self.snapshot.written(given)))
        kept = [self.slots[slot] for slot in sorted(self.slots)] + self.drawn
        observed = [Observed(dict(o.answers), {q: int(s) for q, s in o.sums.items()}, o.index) for o in kept]
        return observed, "; ".join(problems)
