"""A timed round's integrity where its calls run (docs/integrity.md): fresh content on every call, each answer read
inside its timed region, the checks of what the calls did (RoundGuard); the run's side is run/audit.py."""

from __future__ import annotations

import functools
import itertools
import secrets
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from harness.calls.call import poison
from harness.calls.contract import Snapshot, aliased, not_plain
from harness.measure.timing import Guard
from harness.cases.case import Inputs
from harness.store.schema import BWD



class Watched(Protocol):
    """What a RoundGuard needs of the phase it watches (timed.Phase is one): the call's buffers by name, how a call's
    content is written into them, what they hold for given inputs, and a call's answers by quantity."""

    buffers: dict[str, torch.Tensor]
    fresh: Callable[["CallContent", Inputs], None] | None
    sources: Callable[[Inputs], dict[str, torch.Tensor]] | None
    answers: Callable[[object], dict[str, torch.Tensor]] | None

#: besides its last call, a round judges JUDGED_DRAWS (k) of its other samples, drawn as each returns (selection
#: sampling, Knuth's algorithm S: a sample with r others to come, itself included, is kept with odds (k - kept) / r):
#: every k of them equally likely, only those k copied. A kernel wrong on m of n escapes with odds C(n - m, k) / C(n, k)
#: <= (1 - m/n)^k: wrong on half, 1/16 a round, 1/4096 a key (three rounds). A plugin reading the worker's memory sees
#: when k are kept as it sees which were (docs/integrity.md: out of reach)
JUDGED_DRAWS = 4
#: calls' contents drawn in one draw, at most: a fast key's round makes ~200 calls, and a draw costs ~35 us and ~3.7 us
#: a content (2 x 4 slices of 64 columns); a round's first draw is of FIRST_DRAWN, each next of twice the last, since a
#: mid-size key's round makes ~15 calls (draws of 64 threw away three contents in four)
DRAWN_AT_ONCE = 64
FIRST_DRAWN = 16


#: the signed powers of two a call's v and dO slices are scaled by: exact in every float format (none overflows at 2)
SLICE_SCALES = (-2.0, -1.0, 1.0, 2.0)
_SLICE_SCALES = torch.tensor(SLICE_SCALES)
#: a phase's buffers by the Inputs field each holds
INPUT_NAMES = {"q": "q", "k": "k", "v": "v", "dO": "d_out"}


@dataclass(frozen=True)
class CallContent:
    """One timed call's own content on top of its round's inputs: a sign per (batch, kv head, head-dim column) of q and
    k together (every product of q.k is unchanged, so the scores are bit for bit), a signed power of two per (batch,
    kv head) of v and of dO - one for all slices where sinks or a bias take gradients (summed over batch and heads),
    signs alone for v in an FP8 KV cache. q heads take their kv head's factors (kv head = q head // group). Every
    answer is the round's answer times an exact factor per slice (`undo` divides it out). Factors: (batch, kv heads,
    1, head dim) for qk, (batch, kv heads, 1, 1) for v and dO; the space is 2^(batch.kv_heads.head_dim) x 16^(batch.
    kv_heads) contents - no memo keyed on any fingerprint of the inputs sees one twice."""

    #: None: left as they are (the backward alone: its graph is built on them)
    qk: torch.Tensor | None
    v: torch.Tensor | None
    d_out: torch.Tensor

    @classmethod
    def draws(cls, case, generator: torch.Generator, many: int, *, backward_alone: bool = False, uniform: bool = False,
              like: torch.Tensor | None = None) -> list["CallContent"]:
        """`many` fresh contents for `case` from `generator`, in one draw (a call's own costs no more than picking it),
        as `like`'s dtype and device; backward_alone: q, k and v stay (the graph is built), dO alone changes; uniform:
        one v and one dO factor for every slice (sinks or a bias take gradients)."""
        b, hkv, d = case.batch, case.kv_heads, case.head_dim
        n, like = (1 if uniform else b * hkv), (torch.empty(0) if like is None else like)
        scales = _SLICE_SCALES[torch.randint(len(SLICE_SCALES), (many, 2, n), generator=generator)].to(like)
        shape = (many, 1, 1, 1, 1) if uniform else (many, b, hkv, 1, 1)
        d_out = scales[:, 1].reshape(shape).expand(many, b, hkv, 1, 1)
        if backward_alone:
            return [cls(None, None, o) for o in d_out.unbind(0)]
        v = scales[:, 0].reshape(shape).expand(many, b, hkv, 1, 1)
        v = v.sign() if case.fp8_kv is not None else v
        qk = 1 - 2 * torch.randint(2, (many, b, hkv, 1, d), generator=generator, dtype=torch.uint8).to(like)
        return [cls(*factors) for factors in zip(qk.unbind(0), v.unbind(0), d_out.unbind(0))]

    def factors(self, group: int) -> dict[str, torch.Tensor]:
        """Each input's factor by its buffer's name (q, k, v, dO; dO alone for the backward alone), canonical layout,
        as drawn (draw's `like`)."""
        factors = {"dO": self._q_heads(self.d_out, group)}
        if self.qk is not None:
            factors.update(q=self._q_heads(self.qk, group), k=self.qk, v=self.v)
        return factors

    def inputs(self, inputs: Inputs) -> Inputs:
        """`inputs` with this content: each of q, k, v and dO times its factor."""
        factors = self.factors(inputs.q.shape[1] // inputs.k.shape[1])
        return inputs._replace(**{name: getattr(inputs, name) * factors[key].to(inputs.q)
                                  for key, name in INPUT_NAMES.items() if key in factors})

    def factor(self, quantity: str, group: int) -> torch.Tensor:
        """What this content multiplies `quantity`'s answer by (canonical layout, broadcast): signs, powers of two."""
        if quantity == "dv":
            return self.d_out
        if quantity == "out":  # the backward alone's content leaves v (and q, k) as they are
            return self._q_heads(torch.ones_like(self.d_out) if self.v is None else self.v, group)
        v_d_out = self.d_out if self.v is None else self.v * self.d_out
        if quantity not in ("dq", "dk"):
            return v_d_out.flatten()[0]  # dsinks, dbias: uniform (draws(uniform=True))
        factor = v_d_out if self.qk is None else self.qk * v_d_out
        return self._q_heads(factor, group) if quantity == "dq" else factor

    def undo(self, quantity: str, answer: torch.Tensor, group: int, under: "CallContent | None" = None) -> torch.Tensor:
        """A copy of `answer` (canonical) divided by its factor (and by that of the content it lies on, `under`, in one
        division: a product of powers of two is one): the round's answer, bit for bit when the call's was exact."""
        factor = self.factor(quantity, group)
        factor = factor if under is None else factor * under.factor(quantity, group)
        # + 0 makes every zero +0: a zero's sign follows the signs of the terms summed to it, which the content flips,
        # and the judge's memo (benchmark.judge_timed) reads bits
        return torch.div(answer, factor.to(answer)).add_(0.0)

    @staticmethod
    def _q_heads(factor: torch.Tensor, group: int) -> torch.Tensor:
        return factor.repeat_interleave(group, dim=1) if group > 1 else factor


#: an answer's bits read as integers of its element's size: the checksum every timed call's answer gets in its region
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def checksum(answer: torch.Tensor) -> torch.Tensor:
    """The sum (int64, wrapping) of an answer's bits read as integers: every element read, in any order and layout
    alike, so the run can recompute it on the bytes it receives. A 0-d tensor where the answer lives (on CUDA it is
    enqueued, not waited for)."""
    return torch.sum(answer.detach().view(_BITS[answer.element_size()]), dtype=torch.int64)


@dataclass(frozen=True)
class Observed:
    """One judged call's answers as they returned (canonical layout, copied as the call returned), the checksums
    taken of them inside the call's own timed region, and the contents it ran on (its own on its round's): what the
    run's process needs to check that it judges what was read then, and to divide the contents out (`received`)."""

    answers: dict
    sums: dict
    content: CallContent | None
    round: CallContent


class RoundGuard(Guard):
    """A timed round's integrity where its calls run: the one entry every clock path (timing.measure: CPU clock, CUDA
    events, CUDA graph replays) calls, in named steps - before_call before every estimate call and sample (warm-up calls
    repeat the content before them: timing.WARMUP_RENEWS), in_call inside every call's timed region, after_call after
    each sample but the last, after_last_call after the last - then finish."""

    def __init__(self, case, phase: str, verified: Inputs):
        # drawn where the calls run, from a seed no code saw: a kernel cannot know a call's content before it
        self.draws = functools.partial(CallContent.draws, case, torch.Generator().manual_seed(secrets.randbits(63)),
                                       uniform=verified.sinks is not None or verified.bias is not None)
        self.group = case.heads // case.kv_heads
        #: the round's own content, which the phase is built on (the backward alone's graph: q, k and v)
        self.round = self.draws(1)[0]
        self.inputs = self.round.inputs(verified)
        #: the samples' answers drawn so far (after_call), as they returned; the last call's after them
        self.drawn: list[Observed] = []
        self.sums: dict[str, torch.Tensor] = {}  # in_call: the last call's answers' checksums
        self.aliased = ""  # after_last_call: '' unless the last call's output is not its own
        self.not_plain = ""  # '' unless a call's output or a drawn answer was a torch.Tensor subclass
        self.content: CallContent | None = None
        # the calls' contents, drawn together as needed (docs/integrity.md: what a kernel can read): FIRST_DRAWN, then
        # twice as many a draw, up to DRAWN_AT_ONCE
        self.contents = itertools.chain.from_iterable(
            self.draws(min(FIRST_DRAWN << i, DRAWN_AT_ONCE), backward_alone=phase == BWD, like=self.inputs.q)
            for i in itertools.count())

    def watch(self, timed: Watched) -> None:
        """The phase built on `inputs`: what its calls must leave as given is taken now."""
        self.timed, self.snapshot = timed, Snapshot(timed.buffers)

    def before_call(self) -> None:
        """Content no earlier call had, written into the buffers outside the timed region (CallContent)."""
        self.content = next(self.contents)
        self.timed.fresh(self.content, self.inputs)

    def in_call(self, value: object) -> None:
        """Inside the call's timed region, on every call: each answer read in full (its checksum), so deferred work,
        a lazy fill or a hook that fills memory when it is read costs its time inside the sample; a judged answer's
        copy must still have this checksum when the run receives it (`received`)."""
        self.sums = {quantity: checksum(answer) for quantity, answer in self.timed.answers(value).items()}

    def after_call(self, value: object, left: int) -> None:
        """Kept to be judged or not, drawn only now (JUDGED_DRAWS; `left`: the samples after it): no kernel knows.
        Every call's output must be exactly torch.Tensor (contract.not_plain)."""
        self._plain(value, "a timed call")
        if secrets.randbelow(left) < JUDGED_DRAWS - len(self.drawn):
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

    def _observed(self, value: object) -> Observed:
        # copied as the call returned (the run divides the contents out), then the output poisoned: an `empty` of the
        # next call cannot find it
        answers = self.timed.answers(value)
        for quantity, answer in answers.items():
            self._plain(answer, f"a timed call's {quantity}")
        copies = {q: torch.empty_like(a, memory_format=torch.contiguous_format).copy_(a) for q, a in answers.items()}
        if isinstance(value, torch.Tensor):
            poison(value)
        return Observed(copies, dict(self.sums), self.content, self.round)

    def finish(self, device: torch.device) -> tuple[list[Observed], str]:
        """(the observed calls' answers as they returned, on the CPU, with their in-region checksums and contents:
        benchmark.judge_timed checks and judges them in the run's process; the integrity problems, '' when none)."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        # what the last call was given, made anew here: the buffers must still hold it
        given = None if self.content is None else self.timed.sources(self.content.inputs(self.inputs))
        problems = filter(None, (self.not_plain, self.aliased, self.snapshot.written(given)))
        observed = [Observed({q: a.cpu() for q, a in o.answers.items()}, {q: int(s) for q, s in o.sums.items()},
                             o.content if o.content is None else _on_cpu(o.content), _on_cpu(o.round))
                    for o in self.drawn]
        return observed, "; ".join(problems)


def _on_cpu(content: CallContent) -> CallContent:
    return CallContent(*(None if t is None else t.cpu() for t in (content.qk, content.v, content.d_out)))
