"""The runner builds a probe's rows under its tag as it makes them, whatever the outcome (no re-keying after)."""

import torch

from harness.backends.base import Backend
from harness.backends.naive import Naive
from harness.run.runner import execute, prepare_case
from harness.cases.case import AttentionCase

CPU = torch.device("cpu")
CASE = AttentionCase(1, 2, 8, 8, "fp32")


class Absent(Backend):
    name = "absent"

    def unavailable_reason(self, device):
        return "not installed here"


def test_every_row_is_tagged_as_built():
    prepared = prepare_case(CASE, CPU)
    judged = execute(Naive(), prepared, tag="docs").rows
    refused = execute(Absent(), prepared, tag="docs").rows
    assert [(r.case_id, r.phase, r.status) for r in judged] == [(f"docs:{CASE.id}", "fwd", "pass"),
                                                                (f"docs:{CASE.id}", "bwd", "pass")]
    assert {(r.case_id, r.status) for r in refused} == {(f"docs:{CASE.id}", "unavailable")}
    assert {r.case_id for r in execute(Naive(), prepared).rows} == {CASE.id}
