"""Edge cases: arrangements reach the backend, planted bugs fail, limitations hold, empty probes isolate crashes."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import AttentionCase, make_inputs
from harness.backends import get_backends
from harness.backends.base import Backend
from harness.backends.naive import Naive
from harness.probes.edge_cases import NAN_TAIL, EdgeCase, edge_cases, edge_inputs, run_edge
from harness.isolation.supervisor import IsolatedExecutor
from harness.probes.empty import SHAPES, empty_row, probe, probe_all
from harness.cases.masks import Causal, KeyPadding
from harness.store.writer import ResultsWriter

CPU = torch.device("cpu")
CRASH_MODULE = str(Path(__file__).parents[2] / "fixtures" / "edge_crash_backend.py")


class Recording(Naive):
    """Naive attention that keeps what it was handed, including the gradient its output receives."""

    name = "recording"

    def forward(self, q, k, v, *, mask, scale):
        self.inputs = (q, k, v)
        out = super().forward(q, k, v, mask=mask, scale=scale)
        if out.requires_grad:
            out.register_hook(lambda g: setattr(self, "d_out", g))
        return out


class ReadsPastTheEnd(Naive):
    """A tile-overrun bug: reads K/V up to the next multiple of 16 positions and masks the extra scores,
    so 0 * (whatever lies in memory there) reaches the output."""

    name = "reads-past-end"

    def forward(self, q, k, v, *, mask, scale):
        b, h, sk, d = k.shape
        tile = -(-sk // 16) * 16
        k_t, v_t = (torch.as_strided(t, (b, h, tile, d), t.stride(), t.storage_offset()) for t in (k, v))
        scores = (q @ k_t.transpose(-1, -2)) * scale
        allowed = mask.materialize(q.shape[2], sk, q.device, batch=b)
        allowed = torch.nn.functional.pad(allowed, (0, tile - sk))               # the overrun keys: masked
        return torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v_t


def edge(name, case, arrange="plain", **kw):
    return EdgeCase(name, case, arrange, **kw)


def run(edge_case, backend):
    rows = run_edge(edge_case, backend, CPU)
    return {r.phase: r for r in rows}


def test_noncontig_inputs_and_grad_reach_the_backend_strided():
    rec = Recording()
    rows = run(edge("noncontig", AttentionCase(2, 4, 9, 16, "fp32", seq_k=11, mask=Causal()), "noncontig"), rec)
    assert {r.status for r in rows.values()} == {"pass"}
    assert all(not t.is_contiguous() and t.stride(-1) == 1 for t in rec.inputs)
    assert not rec.d_out.is_contiguous()


def test_fused_qkv_slices_expanded_kv_and_nan_tail_reach_the_backend():
    rec = Recording()
    run(edge("fused", AttentionCase(1, 2, 8, 16, "fp32"), "fused-qkv"), rec)
    assert all(t.stride(-2) == 3 * 16 for t in rec.inputs)
    run(edge("expanded", AttentionCase(1, 4, 8, 16, "fp32", kv_heads=1), "expanded-kv"), rec)
    assert rec.inputs[1].shape[1] == 4 and rec.inputs[1].stride(1) == 0
    run(edge("tail", AttentionCase(1, 2, 8, 16, "fp32", seq_k=5), "nan-tail"), rec)
    k = rec.inputs[1]
    beyond = torch.as_strided(k, (1, 2, 5 + NAN_TAIL, 16), k.stride(), k.storage_offset())[:, :, 5:]
    assert beyond.isnan().all()


def test_reading_past_the_end_fails_the_nan_tail_case_only():
    case = AttentionCase(2, 2, 9, 16, "fp32", seq_k=13, mask=KeyPadding((7, 13)))
    bad = run(edge("nan-tail", case, "nan-tail"), ReadsPastTheEnd())
    assert bad["fwd"].status == "fail" and "NaN" in bad["fwd"].reason
    assert run(edge("nan-tail", case, "nan-tail"), Naive())["fwd"].status == "pass"


def test_rows_are_keyed_apart_from_correctness_rows():
    rows = run(edge("noncontig", AttentionCase(1, 2, 4, 16, "fp32"), "noncontig"), Naive())
    assert {r.case_id for r in rows.values()} == {"edge:noncontig:fp32-b1-h2-s4-d16-none"}


def test_magnitude_scales_q_k_v_not_d_out_rounding_once():
    e = edge("big", AttentionCase(1, 2, 4, 16, "fp32"), magnitude=(3.0, 3.0, 10.0))
    base, scaled = make_inputs(e.case), edge_inputs(e, CPU)
    for a, b, m in zip(base, scaled, (3.0, 3.0, 10.0, 1.0)):
        assert torch.equal(b, a * m)
    low = edge("big", AttentionCase(1, 2, 4, 16, "bf16"), magnitude=(3.0, 3.0, 10.0))
    assert torch.equal(edge_inputs(low, CPU).q, (base.q * 3.0).to(torch.bfloat16))


def test_documented_naive_limitations_hold_and_sdpa_math_passes():
    declared = {f.case for f in Naive.known_failures if f.probe == "edge"}
    limited = [e for e in edge_cases("default") if e.name in declared]
    assert {e.name for e in limited} == declared == {"fp16-qk-overflow", "fp16-large-v"}
    for e in limited:
        assert run(e, Naive())["bwd"].status == "fail"
        assert {r.status for r in run(e, get_backends("sdpa-math")[0]).values()} == {"pass"}


def test_default_tier_is_part_of_full():
    default, full = edge_cases("default"), edge_cases("full")
    assert set(default) < set(full) and all(e.tier == "default" for e in default)


@pytest.mark.parametrize("make, match", [
    (lambda: edge("x", AttentionCase(1, 2, 4, 16, "fp32"), "transposed"), "arrange='transposed'; allowed: plain"),
    (lambda: EdgeCase("x", AttentionCase(1, 2, 4, 16, "fp32"), tier="nightly"), "tier='nightly'"),
    (lambda: edge("x", AttentionCase(1, 4, 4, 16, "fp32", kv_heads=2), "expanded-kv"), "kv_heads=2"),
    (lambda: edge("x", AttentionCase(1, 2, 4, 16, "fp32", seq_k=5), "fused-qkv"), "one shape"),
    (lambda: edge_cases("nightly"), "tier='nightly'"),
])
def test_invalid_edge_cases_name_the_value(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("shape", SHAPES)
def test_empty_tensors_in_process(shape):
    assert probe(get_backends("sdpa-math")[0], CPU, shape)["status"] == "pass"


def test_refusing_an_empty_problem_is_unsupported():
    class Refuses(Naive):
        def forward(self, q, k, v, *, mask, scale):
            raise ValueError("empty input")
    outcome = probe(Refuses(), CPU, "batch0")
    assert outcome["status"] == "unsupported" and "empty input" in outcome["reason"]


def test_crash_in_a_worker_is_an_error_and_the_other_probes_still_run(tmp_path):
    # the crashing backend is registered only in the worker (it loads the plugin module); here a stand-in names it
    stand_in = type("CrashStandIn", (Backend,), {"name": "crash-on-empty-seq"})()
    executor = IsolatedExecutor(CPU, modules=(CRASH_MODULE,), log_dir=str(tmp_path / "workers"))
    try:
        out = probe_all([stand_in, Naive()], CPU, executor)
    finally:
        executor.close()
    assert out[("crash-on-empty-seq", "batch0")]["status"] == "pass"
    crash = out[("crash-on-empty-seq", "seq_q0")]
    assert crash["status"] == "error" and "signal SIGSEGV" in crash["reason"]
    assert out[("crash-on-empty-seq", "seq_k0")]["status"] == "error"  # the restarted worker crashes again
    assert out[("naive", "seq_k0")]["status"] == "pass"
    row = empty_row(Naive(), "seq_k0", out[("naive", "seq_k0")], CPU)
    assert (row.batch, row.seq_q, row.seq_k) == (2, 5, 0) and row.case_id.startswith("edge:empty-seq_k0:")
    ResultsWriter(tmp_path / "r.csv").write([row])                      # the schema accepts it


def test_a_worker_dying_by_a_signal_leaves_no_semaphore_to_the_runs_resource_tracker(tmp_path):
    """tqdm's default lock is a process-shared semaphore; a worker killed after inductor drew a progress bar used
    to leave it registered, and every run with a crashing flex case ended with "leaked semaphore objects"."""
    pytest.importorskip("tqdm", reason="tqdm (torch's optional progress bars) is what planted the semaphore")
    script = (f"import torch\n"
              f"from harness.backends.naive import Naive\n"
              f"from harness.isolation.supervisor import IsolatedExecutor\n"
              f"from harness.probes.empty import probe_all\n"
              f"from harness.backends.base import Backend\n"
              f"if __name__ == '__main__':\n"
              f"    cpu = torch.device('cpu')\n"
              f"    executor = IsolatedExecutor(cpu, modules=({CRASH_MODULE!r},), log_dir={str(tmp_path)!r})\n"
              f"    stand_in = type('CrashStandIn', (Backend,), {{'name': 'crash-on-empty-seq'}})()\n"
              f"    out = probe_all([stand_in], cpu, executor)\n"
              f"    executor.close()\n"
              f"    assert out[('crash-on-empty-seq', 'seq_q0')]['status'] == 'error', out\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "leaked semaphore" not in done.stderr
