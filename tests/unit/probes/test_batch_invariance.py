"""The batch-invariance probe: sequence 0 alone vs co-batched, bitwise; a backend whose answer depends on the batch
is seen to differ, an eager one is not."""

import pytest
import torch

import harness
from harness import Backend, register
from harness.backends import registry
from harness.probes.batch_invariance import alone, batch_invariance_check, check_batch_invariance, invariance_case
from harness.cases.case import make_inputs

CPU = torch.device("cpu")


class BatchDependent(Backend):
    """Correct to rounding, but its reduction order depends on the batch size (a split count chosen from it)."""

    name = "test-batch-dependent"

    def forward(self, q, k, v, *, mask, scale):
        from harness.oracle.baseline import naive_attention

        out = naive_attention(q.double(), k.double(), v.double(), mask, scale)
        return (out * (1 + 1e-6 * (q.shape[0] - 1))).to(q.dtype)


@pytest.fixture
def batch_dependent():
    register(BatchDependent)
    yield harness.get_backends(BatchDependent.name)[0]
    registry._REGISTRY.pop(BatchDependent.name)


def test_alone_is_the_first_sequence_with_its_own_lengths():
    case = invariance_case("paged-decode", torch.float32, CPU)
    single, inputs = alone(case, make_inputs(case))
    assert single.batch == 1 and single.mask.lengths == case.mask.lengths[:1] and single.page_size == 16
    assert single.seq_k == case.seq_k and inputs.k.shape[0] == 1


def test_eager_naive_is_batch_invariant_in_every_kind():
    for kind in ("prefill", "decode", "paged-decode"):
        row = check_batch_invariance(harness.get_backends("naive")[0], kind, CPU)
        assert row.status == "observed" and row.observed == "bitwise equal alone and co-batched", (kind, row)
        assert row.case_id.startswith(f"batch-invariance-{kind}:")


def test_a_batch_dependent_backend_is_seen_to_differ(batch_dependent):
    row = check_batch_invariance(batch_dependent, "decode", CPU)
    assert row.status == "observed" and row.observed.startswith("differs alone vs co-batched")
    paged = check_batch_invariance(batch_dependent, "paged-decode", CPU)
    assert paged.status == "unsupported" and "paged_kv=False" in paged.reason


def test_the_advisors_check_on_a_workload(batch_dependent):
    case = invariance_case("prefill", torch.float32, CPU)
    assert batch_invariance_check(harness.get_backends("naive")[0], CPU, case)["batch_invariant"] == "yes"
    found = batch_invariance_check(batch_dependent, CPU, case)
    assert found["batch_invariant"] == "no" and "max |diff|" in found["batch_invariance_note"]
