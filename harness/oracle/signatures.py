"""Known cheats' signatures in a failure's reason, said in plain words (what the kernel did, not what was measured)."""

from __future__ import annotations

import re

#: (a pattern of the reason the checks give, what a kernel that fails so has done); first match wins. The patterns
#: are the checks' own words (calls/call.py, calls/round.py, oracle/verdict.py, torch's autograd error),
#: each tested on a planted kernel's real reason (tests/unit/oracle/test_signatures.py).
SIGNATURES: tuple[tuple[re.Pattern, str], ...] = tuple((re.compile(p), words) for p, words in (
    (r"clock disagrees", "its process's clock was slowed or rewritten: its timings were not the calls' time"),
    (r"on new inputs|a call on the round's inputs|no earlier call saw",
     "answers from an earlier call: right when judged, wrong on the timed calls' new inputs"),
    (r"does not require grad and does not have a grad_fn",
     "output not computed on these inputs: detached from them (an answer kept from an earlier call?)"),
    (r"its output aliases its input", "returns one of its inputs as its output"),
    (r"wrote into its input", "writes into its inputs (uses them as scratch or leaves its answer there)"),
    (r"out has NaN/inf where the reference is finite", "output not computed on these inputs: uninitialised memory "
                                                       "returned (a kept or unfinished answer?)"),
))


def signature(reason: str | None) -> str | None:
    """The plain words of the first known cheat whose signature the reason shows, or None."""
    return next((words for pattern, words in SIGNATURES if reason and pattern.search(reason)), None)
