"""A backend call as data: every outcome of the backend is a CallResult (never an exception), the output contract
is checked, and calls cross to a worker with seeded inputs dropped and tensors intact."""

import pickle

import pytest
import torch

from harness.backends.base import Backend, Plan
from harness.calls.call import Call, run_call
from harness.calls.contract import contract_violation, grad_violation
from harness.isolation.wire import INLINE_BYTES, _Pickler
from harness.cases.case import AttentionCase, make_inputs
from harness.oracle.baseline import naive_attention
from harness.cases.masks import Causal

CPU = torch.device("cpu")
CASE = AttentionCase(2, 4, 16, 8, "fp32", mask=Causal())


class Returns(Backend):
    name = "returns"

    def __init__(self, make=None, exc=None):
        self.make, self.exc = make, exc

    def forward(self, q, k, v, *, mask, scale):
        if self.exc is not None:
            raise self.exc
        return self.make(q)


@pytest.mark.parametrize("backend, status, text", [
    (Returns(exc=SystemExit(3)), "error", "SystemExit(3) raised inside the backend call"),
    (Returns(exc=KeyboardInterrupt()), "error", "KeyboardInterrupt inside the backend call"),
    (Returns(exc=torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")), "oom", "out of memory"),
    (Returns(make=lambda q: None), "error", "forward returned NoneType, not a tensor"),
    (Returns(make=lambda q: [q]), "error", "forward returned list, not a tensor"),
    (Returns(make=lambda q: q.double()), "fail", "output dtype float64, expected float32 (the input dtype)"),
    (Returns(make=lambda q: q[:, :, :3]), "fail", "output shape (2, 4, 3, 8), expected (2, 4, 16, 8)"),
    (Returns(make=lambda q: q.to_sparse()), "fail", "output layout torch.sparse_coo, expected torch.strided"),
])
def test_every_outcome_is_a_result(backend, status, text):
    result = run_call(backend, Call(CASE, 0, backward=True), CPU)
    assert result.out is None and result.failure.status == status and text in result.failure.reason
    assert result.interrupted == isinstance(backend.exc, KeyboardInterrupt)


def test_a_gradient_of_another_kind_than_its_input_is_named():
    leaf = torch.randn(2, 3)
    assert grad_violation("dq", leaf.double(), leaf) == "dq is float64 (2, 3) on cpu, expected float32 (2, 3) on cpu"
    assert grad_violation("dk", leaf.clone(), leaf) is None


def test_contract_accepts_a_right_answer():
    q = torch.randn(2, 4, 16, 8)
    assert contract_violation(q.clone(), q, q, q.dtype) is None


def test_seeded_inputs_do_not_travel_given_ones_do():
    inputs = make_inputs(CASE)
    assert Call(CASE, 0, inputs).to_cpu().inputs is None  # the worker draws them from the seed
    own = Call(CASE, None, inputs).to_cpu()
    assert torch.equal(own.inputs.q, inputs.q)
    with pytest.raises(ValueError, match="needs a seed"):
        Call(CASE, None)


@pytest.mark.parametrize("tensor", [torch.randn(3, 5), torch.randn(4).to(torch.bfloat16), torch.empty(0, 3),
                                    torch.randn(6, 4)[:, 1], torch.arange(10, dtype=torch.int64)])
def test_tensors_cross_the_pipe_intact(tensor):
    back = pickle.loads(_Pickler.dumps({"t": tensor}))["t"]
    assert back.dtype == tensor.dtype and torch.equal(back, tensor)


@pytest.mark.parametrize("from_backend", [False, True], ids=["request", "reply"])
def test_large_tensors_cross_in_the_sender_s_arena_made_once_and_are_copied_out(from_backend, monkeypatch):
    """wire.Channel: tensors over INLINE_BYTES go into the sending end's arena, one shared-memory segment sent once
    and kept while messages fit (then made anew, larger, up to ARENA_KEPT_BYTES; a message larger still gets one of
    its own, and the kept one stays for the next); the reader copies each out, so what it keeps is its own memory,
    which the other end's next message - written into the same arena - leaves as it was."""
    import multiprocessing

    from harness.isolation import wire
    from harness.isolation.wire import ARENA_STEP_BYTES, Channel

    big = [torch.randn(INLINE_BYTES // 4 + 1), torch.randn(600, 200).t()[::2], torch.arange(100_000).to(torch.bfloat16)]
    message = {"answers": big, "small": torch.ones(3)}
    a, b = multiprocessing.Pipe()
    sender, receiver = Channel(a, from_backend=False), Channel(b, from_backend=from_backend)
    sender.send(message)
    arena = sender._arena
    assert arena is not None and arena.is_shared() and arena.numel() == ARENA_STEP_BYTES
    back = receiver.recv()
    assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(big, back["answers"]))
    assert torch.equal(back["small"], torch.ones(3))
    assert all(t.untyped_storage().data_ptr() != arena.data_ptr() for t in back["answers"])
    sender.send({"answers": [-t for t in big]})  # the same arena, written again: the first message's copies stand
    assert sender._arena is arena and receiver._peer is not None
    again = receiver.recv()
    assert all(torch.equal(x, y) and torch.equal(-x, z) for x, y, z in zip(big, back["answers"], again["answers"]))
    larger = torch.randn(ARENA_STEP_BYTES // 2 + 1)  # 2 MiB and 4 bytes: made anew, 3 MiB
    sender.send(larger)
    assert torch.equal(receiver.recv(), larger) and sender._arena.numel() == 3 * ARENA_STEP_BYTES
    kept = sender._arena
    monkeypatch.setattr(wire, "ARENA_KEPT_BYTES", 3 * ARENA_STEP_BYTES)
    largest = torch.randn(ARENA_STEP_BYTES)  # 4 MiB: a segment of its own, not kept
    sender.send(largest)
    assert torch.equal(receiver.recv(), largest) and sender._arena is kept
    sender.send(larger + 1)  # read from the kept arena again, at both ends
    assert torch.equal(receiver.recv(), larger + 1)


def test_a_sticky_cuda_error_ends_the_worker_after_its_reply(monkeypatch):
    """A device-side assert or an illegal address poisons the CUDA context for every later call in the process:
    the worker checks after each task and exits (status 3), and the supervisor starts a fresh one."""
    from harness.isolation import supervisor, worker

    def broken(device=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "synchronize", broken)
    assert worker._cuda_broken(torch.device("cuda", 0)) is True
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    assert worker._cuda_broken(torch.device("cuda", 0)) is False
    assert worker._cuda_broken(CPU) is False
    process = type("P", (), {"exitcode": 3})()
    assert "sticky CUDA error" in supervisor._death(process)


class Planned(Backend):
    """Names its kernels in its plan (harness.Plan), as a built-in backend does."""

    name = "planned"

    def prepare(self, case, device):
        return Plan(op="planned:fwd-kernel", backward_op="planned:bwd-kernel")

    def forward(self, q, k, v, *, mask, scale, prepared=None):
        self.plan_for(prepared, q, k, v, mask=mask, scale=scale)
        return naive_attention(q, k, v, mask, scale)


class Stateful(Planned):
    """Prepares state that is not a Plan: its rows name the backend."""

    name = "stateful"

    def prepare(self, case, device):
        return {"anything": 1}


@pytest.mark.parametrize("backend, ops", [(Planned(), ("planned:fwd-kernel", "planned:bwd-kernel")),
                                          (Stateful(), ("stateful", "stateful"))], ids=lambda x: getattr(x, "name", ""))
def test_the_result_names_the_kernels_the_plan_names(backend, ops):
    result = run_call(backend, Call(CASE, backward=True), CPU)
    assert result.failure is None and result.backward_failure is None
    assert (result.op, result.backward_op) == ops
    native = run_call(backend, Call(CASE, entry="native_causal"), CPU)  # not offered: an error, named nothing
    assert native.failure is not None and native.op == ""
