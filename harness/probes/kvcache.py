"""Decode and chunked prefill against a KV cache, per backend, judged against one full causal pass."""

from __future__ import annotations

from dataclasses import replace

import torch

from harness.backends.base import Backend
from harness.isolation.executor import Executor, make_executor
from harness.run.runner import execute, prepare_case
from harness.oracle.prepared import PreparedCase
from harness.probes.common import probe_row
from harness.cases.case import AttentionCase, Inputs, make_inputs
from harness.cases.masks import Causal, CausalBottomRight
from harness.store.schema import BWD, FAIL, FWD, GRADS, PASS, Row


def _chunk(full: AttentionCase, inputs: Inputs, start: int, stop: int, device: torch.device) -> PreparedCase:
    """Queries (and d_out) start:stop over the cache at that point, keys and values 0:stop (bottom-right causal)."""
    q, k, v, d_out = inputs[:4]
    piece = replace(full, seq_q=stop - start, seq_k=stop, mask=CausalBottomRight())
    sliced = Inputs(q[:, :, start:stop], k[:, :, :stop], v[:, :, :stop], d_out[:, :, start:stop])
    return prepare_case(piece, device, inputs=sliced)


def _full(case: AttentionCase) -> AttentionCase:
    if case.seq_q != case.seq_k or case.mask != Causal():
        raise ValueError(f"KV-cache checks take a square causal case; got {case.id}")
    return case


def decode_rows(backend: Backend, case: AttentionCase, device: torch.device, *, seed: int = 0,
                run_id: str = "", executor: Executor | None = None) -> list[Row]:
    """Rows 'decode:<decode case id>' (fwd, bwd): the last query of `case` over its whole cache."""
    full = _full(case)
    prepared = _chunk(full, make_inputs(full, device, seed), full.seq_q - 1, full.seq_q, device)
    return execute(backend, prepared, run_id, executor=executor, tag="decode").rows


def chunk_bounds(seq: int, chunks: int) -> list[tuple[int, int]]:
    """`chunks` contiguous pieces covering 0..seq, sizes as equal as possible (the first ones larger)."""
    if not 1 <= chunks <= seq:
        raise ValueError(f"chunks={chunks}: must be between 1 and seq={seq}")
    edges = [round(i * seq / chunks) for i in range(chunks + 1)]
    return list(zip(edges, edges[1:]))


def prefill_rows(backend: Backend, case: AttentionCase, chunks: int, device: torch.device, *, seed: int = 0,
                 run_id: str = "", executor: Executor | None = None) -> list[Row]:
    """Rows 'prefill:chunk<i>of<n>:<piece id>' per chunk, and 'prefill:assembled<n>:<case id>' (fwd, bwd)."""
    executor = executor if executor is not None else make_executor()
    full = _full(case)
    inputs = make_inputs(full, device, seed)
    rows, outs, dq, dk, dv, have_grads = [], [], [], 0, 0, True
    for i, (start, stop) in enumerate(chunk_bounds(full.seq_q, chunks)):
        result = execute(backend, _chunk(full, inputs, start, stop, device), run_id, executor=executor,
                         tag=f"prefill:chunk{i + 1}of{chunks}")
        rows += result.rows
        ops = {row.phase: row.backend_op for row in result.rows}       # phase -> the kernel the chunks ran
        if result.out is None:
            return rows                                                 # the chunk rows already say why
        outs.append(result.out)
        have_grads = have_grads and set(result.grads) == set(GRADS)
        if have_grads:
            pad = (0, 0, 0, full.seq_k - stop)                          # this chunk's cache is keys 0:stop
            dq.append(result.grads["dq"])
            dk = dk + torch.nn.functional.pad(result.grads["dk"], pad)
            dv = dv + torch.nn.functional.pad(result.grads["dv"], pad)
    whole = prepare_case(full, device, inputs=inputs)                   # reference and naive errors of one pass

    judged = {FWD: [whole.judged("out", torch.cat(outs, dim=2), backend.name)]}
    if have_grads:  # dq and dk held to the size of the terms they cancel, as a whole pass's are
        judged[BWD] = [whole.judged(name, t, backend.name) for name, t in
                       (("dq", torch.cat(dq, dim=2)), ("dk", dk), ("dv", dv))]
    for phase, checks in judged.items():
        bad = [c.describe() for c in checks if not c.passed]
        rows.append(probe_row(full, backend, device, tag=f"prefill:assembled{chunks}", phase=phase,
                              status=FAIL if bad else PASS, reason="; ".join(bad), checks=checks, run_id=run_id,
                              op=ops.get(phase, "")))
    return rows
