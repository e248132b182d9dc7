"""The modifier semantics questions name each convention: the spec's for naive/SDPA, the planted ones for the
broken backends, and unsupported (never called) where a backend does not declare the modifier."""

import pytest
import torch

from harness.backends.registry import get_backends
from harness.probes.semantics import QUESTIONS, ask
from tests.fixtures.broken_modifier_backends import ModifierBackend

CPU = torch.device("cpu")


@pytest.mark.parametrize("question, backend, observed", [
    ("softcap-order", "naive", "before the mask"),
    ("softcap-order", "cap-after-mask", "after the mask"),
    ("alibi-convention", "sdpa", "bottom-right symmetric (FA2)"),
    ("alibi-convention", "alibi-top-left", "top-left symmetric"),
    ("alibi-convention", "alibi-sign-flipped", "sign flipped"),
    ("sink-empty-rows", "sdpa-math", "out=0"),
    ("sink-empty-rows", "naive", "out=0"),
])
def test_modifier_questions_name_the_convention(question, backend, observed):
    chosen = get_backends([backend])[0] if backend in ("naive", "sdpa", "sdpa-math") else ModifierBackend(backend)
    row = ask(question, chosen, CPU)
    assert (row.status, row.observed) == ("observed", observed)
    assert row.case_id.startswith(f"semantics:{question}:")


def test_undeclared_modifier_is_unsupported_with_the_reason():
    row = ask("softcap-order", get_backends(["sdpa"])[0], CPU)
    assert row.status == "unsupported" and "SDPA has no softcap argument" in row.reason
    assert {"softcap-order", "alibi-convention", "sink-empty-rows"} <= set(QUESTIONS)
