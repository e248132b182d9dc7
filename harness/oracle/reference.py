"""The oracle: float64 attention with hand-written gradients, blocked over query rows, on the case's device."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from harness.cases import fp8
from harness.cases.case import AttentionCase, Inputs
from harness.cases.paged import reference_inputs as paged_reference_inputs
from harness.cases.modifiers import alibi_bias, alibi_slopes

#: bytes of score-sized float64 buffers a block may hold (two: the probabilities and their gradient) on the CPU
DEFAULT_BUDGET_BYTES = 256 * 2 ** 20
#: the most rows a block takes on the CPU: larger blocks no longer speed the GEMMs up and spill the caches
#: (256 measured best of 128/256/384/512 at S = 1024 and 2048, D = 128; benchmarks/reference_throughput.py)
CPU_MAX_BLOCK = 256
#: on a GPU, the block buffers may take this share of the free memory (up to GPU_MAX_BUDGET_BYTES): large blocks
#: keep the FP64 GEMMs big enough to fill the device
GPU_FREE_SHARE, GPU_MAX_BUDGET_BYTES = 1 / 8, 8 * 2 ** 30


def reference_budget(device: str | torch.device) -> int:
    """Bytes the reference's score-sized block buffers may take on `device`."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(max(DEFAULT_BUDGET_BYTES, min(GPU_MAX_BUDGET_BYTES, free * GPU_FREE_SHARE)))
    return DEFAULT_BUDGET_BYTES


class Reference(NamedTuple):
    """float64, canonical layout: out like q with v's head dim, dq/dk/dv like q/k/v, dsinks (heads,), dbias as bias."""

    out: torch.Tensor
    dq: torch.Tensor | None
    dk: torch.Tensor | None
    dv: torch.Tensor | None
    dsinks: torch.Tensor | None = None
    dbias: torch.Tensor | None = None
    #: per cancelling gradient (dq, dk), the root mean square over its entries of the root-sum-square of the terms
    #: it sums before the softmax backward cancels them (verdict.py's rule takes its floor's size from it)
    terms: tuple[tuple[str, float], ...] = ()

    def get(self, quantity: str) -> torch.Tensor | None:
        """The reference of one judged quantity: 'out', 'dq', 'dk', 'dv', 'dsinks' or 'dbias'."""
        if quantity not in QUANTITIES:
            raise ValueError(f"quantity={quantity!r}; allowed: {', '.join(QUANTITIES)}")
        return getattr(self, quantity)

    def terms_of(self, quantity: str) -> float:
        """The size of the terms `quantity` sums before they cancel (0: not a cancelling gradient)."""
        return dict(self.terms).get(quantity, 0.0)

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        return tuple(getattr(self, name) for name in QUANTITIES)

    def to(self, device: str | torch.device) -> "Reference":
        return Reference(*(None if t is None else t.to(device) for t in self.tensors()), self.terms)


#: the judged quantities a Reference holds, in its order
QUANTITIES = Reference._fields[:-1]


def attended(case: AttentionCase, inputs: Inputs) -> Inputs:
    """What the oracle attends for a call on `inputs`: what an FP8 cache holds (K and V, and Q for an FP8 Q/K/V
    case, quantized and dequantized exactly, float64), a paged case's pages gathered back through its block table."""
    if case.fp8_kv is not None:
        inputs = inputs._replace(**dict(zip("kv", fp8.dequantized_kv(case, inputs.k, inputs.v, torch.float64))))
        if case.fp8_q:
            inputs = inputs._replace(q=fp8.dequantized_q(case, inputs.q, torch.float64))
    if case.page_size is not None:
        inputs = paged_reference_inputs(case, inputs)
    return inputs


def reference_flops(case: AttentionCase, grads: bool = True) -> int:
    """The GEMM work the reference does, dense whatever the mask: QK^T and PV forward; dP, dQ, dK, dV backward."""
    per_dim = 2 * case.batch * case.heads * case.seq_q * case.seq_k
    return per_dim * (case.head_dim + case.head_dim_v) * (3 if grads else 1)


def block_rows(case: AttentionCase, budget_bytes: int | None = None, device: str | torch.device = "cpu",
               grads: bool = True, query_heads: int | None = None) -> int:
    """Query rows per block: as many as the budget allows for the score-sized buffers, capped on the CPU;
    query_heads: the (batch x heads) rows of scores a block's query row makes (default: the case's)."""
    budget_bytes = reference_budget(device) if budget_bytes is None else budget_bytes
    query_heads = case.batch * case.heads if query_heads is None else query_heads
    per_row = (2 if grads else 1) * query_heads * case.seq_k * 8                   # float64 buffers of a query row
    rows = max(1, min(case.seq_q, int(budget_bytes // per_row)))
    return min(rows, CPU_MAX_BLOCK) if torch.device(device).type == "cpu" else rows


def reference_attention(case: AttentionCase, inputs: Inputs, *, grads: bool = True, block: int | None = None,
                        device: str | torch.device | None = None, budget_bytes: int | None = None,
                        only: tuple[int, int] | None = None) -> Reference:
    """Exact attention of `inputs` for `case` in float64 on `device` (default: the inputs' own), the result left
    there; gradients use inputs.d_out as upstream. A query row that sees no key gives output 0 and gradient 0. Blocks
    of `block` query rows (default: as many as `budget_bytes` allows, default reference_budget(device)). only=(batch,
    kv head): that one slice (its query heads' out and dq, its dk and dv; dsinks and dbias of it alone, not summed
    over the others), at 1 / (batch x kv heads) of the work; (None, kv head): that kv head's group over every batch
    (its heads' dsinks and dbias exact, summed over the batch as the whole reference sums them)."""
    device = torch.device(device) if device is not None else inputs.q.device
    b, h, hkv, sq, sk, d, dv_dim = (case.batch, case.heads, case.kv_heads, case.seq_q, case.seq_k, case.head_dim,
                                    case.head_dim_v)
    g = h // hkv
    slopes = alibi_slopes(h) if case.alibi else None
    key_mask = functools.partial(case.key_mask, device)
    if only is not None:
        inputs, slopes, key_mask = _one_slice(case, inputs, slopes, key_mask, only)
        b, h, hkv = (b if only[0] is None else 1), g, 1
    block = block or block_rows(case, budget_bytes, device, grads, query_heads=b * h)
    if block < 1:
        raise ValueError(f"block={block}: must be >= 1")
    bh = b * hkv
    cast = dict(dtype=torch.float64, device=device)
    # Query head h uses kv head h // g: view queries as (B * Hkv, g, Sq, D) and let each GEMM take the g heads of
    # a group as extra rows against their one K/V. Viewed as (B, Hkv, g, n, Sk), a block's scores are per query head
    # (h = kv head * g + group member), which is how the per-head modifiers are viewed too.
    q = inputs.q.to(**cast).reshape(bh, g, sq, d)
    k = inputs.k.to(**cast).reshape(bh, sk, d)
    v = inputs.v.to(**cast).reshape(bh, sk, dv_dim)
    # Contiguous K^T and V^T as GEMM left operands: MKL's float64 GEMM runs 1.2-2x faster with both operands in
    # this orientation than with a transposed view of the (Sk, D) tensors (benchmarks/reference_throughput.py).
    k_t, v_t = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()   # (BHkv, D, Sk), (BHkv, Dv, Sk)
    d_out = inputs.d_out.to(**cast).reshape(bh, g, sq, dv_dim) if grads else None
    slopes = slopes.to(**cast) if slopes is not None else None
    sinks = inputs.sinks.to(**cast).view(1, hkv, g, 1, 1) if case.sinks else None
    bias = inputs.bias.to(**cast) if case.bias is not None else None        # (B|1, H, Sq, Sk)
    nb = 0 if bias is None else bias.shape[0]

    out = torch.empty(bh, g, sq, dv_dim, **cast)
    dq = torch.empty(bh, g, sq, d, **cast) if grads else None
    # dK and dV are accumulated transposed, (D, Sk): the block's Q^T dS and dO^T P in that orientation run at
    # the GEMM's full rate, where dS^T Q into (Sk, D) runs at half of it.
    dk_t = torch.zeros(bh, d, sk, **cast) if grads else None
    dv_t = torch.zeros(bh, dv_dim, sk, **cast) if grads else None
    dsinks = torch.zeros(h, **cast) if grads and sinks is not None else None
    dbias = torch.zeros_like(bias) if grads and bias is not None else None
    probs_buffer = torch.empty(bh, g * block * sk, **cast)
    d_probs_buffer = torch.empty(bh, g * block * sk, **cast) if grads else None
    if grads:  # squared norms of the rows dS multiplies: the terms of dQ = K^T dS^T and dK = Q^T dS
        k_norms, dq_terms, dk_terms = (k.square().sum(-1, keepdim=True), torch.zeros((), **cast),
                                        torch.zeros(bh, sk, 1, **cast))
    for start in range(0, sq, block):
        stop = min(sq, start + block)
        n = stop - start
        q_blk = q[:, :, start:stop].reshape(bh, g * n, d)                    # (BHkv, g*n, D): a copy, contiguous
        probs = probs_buffer[:, :g * n * sk].view(bh, g * n, sk)
        torch.baddbmm(probs, q_blk, k.transpose(1, 2), beta=0.0, alpha=case.scale, out=probs)  # scaled scores
        per_head = probs.view(b, hkv, g, n, sk)
        capped = None
        if case.softcap is not None:
            capped = per_head.div_(case.softcap).tanh_().clone()             # t = tanh(s / c), for the chain factor
            per_head.mul_(case.softcap)
        if slopes is not None:
            per_head.add_(alibi_bias(slopes, sq, sk, (start, stop), torch.float64).view(hkv, g, n, sk))
        if bias is not None:
            per_head.add_(bias[:, :, start:stop].reshape(nb, hkv, g, n, sk))
        mask = key_mask(rows=(start, stop))                                  # (B|1, 1, n, Sk)
        if mask is not None:
            view, hidden = probs.view(b, hkv, g, n, sk), ~mask.reshape(mask.shape[0], 1, 1, n, sk)
            view.masked_fill_(hidden, float("-inf"))
        row_max = probs.amax(-1, keepdim=True)
        if sinks is not None:  # m = max(max_j s_ij, sigma_h): always finite, also for a row that sees no key
            row_max = torch.maximum(row_max.view(b, hkv, g, n, 1), sinks).view(bh, g * n, 1)
        else:
            row_max.masked_fill_(row_max == float("-inf"), 0.0)              # rows with no key: all masked below
        probs.sub_(row_max)
        if mask is not None:
            # exp of -inf (or of anything that underflows) takes a slow path, 2-5x the normal one: exp the
            # masked scores as -700 (a normal 1e-304), then set them to exactly 0
            probs.clamp_min_(-700.0).exp_()
            view.masked_fill_(hidden, 0.0)  # (legit scores < -700 below the max keep 1e-304: below any ulp)
        else:
            probs.exp_()
        denominator = probs.sum(-1, keepdim=True)
        sink_probs = None
        if sinks is not None:  # the sink's exp(sigma_h - m) joins the denominator only
            sink_probs = (sinks - row_max.view(b, hkv, g, n, 1)).exp_().view(bh, g * n, 1)
            denominator.add_(sink_probs)
            sink_probs = sink_probs / denominator                            # P_sink, (BHkv, g*n, 1)
        probs.div_(denominator.clamp_min_(1e-300))                           # empty rows stay 0 / tiny = 0
        o_blk = torch.bmm(v_t, probs.transpose(1, 2)).transpose(1, 2)        # O = (V^T P^T)^T, (BHkv, g*n, Dv)
        out[:, :, start:stop] = o_blk.reshape(bh, g, n, dv_dim)
        if not grads:
            continue
        do_blk = d_out[:, :, start:stop].reshape(bh, g * n, dv_dim)
        d_probs = d_probs_buffer[:, :g * n * sk].view(bh, g * n, sk)
        torch.bmm(do_blk, v_t, out=d_probs)                                  # dP = dO V^T
        delta = (do_blk * o_blk).sum(-1, keepdim=True)                       # rowsum(dO * O) = rowsum(P * dP)
        d_probs.sub_(delta).mul_(probs)                                      # dS / scale = P * (dP - delta)
        if sink_probs is not None:   # the sink's value is 0: d sigma = P_sink * (0 - delta)
            dsinks.sub_((sink_probs * delta).view(b, h, n).sum((0, 2)))     # (these two are contiguous)
        if dbias is not None:        # bias is added to the (capped) scores: dbias = dS, summed over a shared batch
            ds_heads = d_probs.view(b, hkv, g, n, sk)
            ds_heads = ds_heads if nb == b else ds_heads.sum(0, keepdim=True)
            dbias[:, :, start:stop] += ds_heads.reshape(nb, h, n, sk)
        if capped is not None:       # through s' = c tanh(s / c): ds = ds' (1 - t^2)
            d_probs.view(b, hkv, g, n, sk).mul_(capped.square_().neg_().add_(1.0))
        dq_t = torch.bmm(k_t, d_probs.transpose(1, 2))                       # dQ^T = K^T dS^T, (BHkv, D, g*n)
        dq[:, :, start:stop] = dq_t.transpose(1, 2).mul_(case.scale).reshape(bh, g, n, d)
        dk_t.baddbmm_(q_blk.transpose(1, 2), d_probs, alpha=case.scale)     # summed over the group's heads too
        dv_t.baddbmm_(do_blk.transpose(1, 2), probs)
        # P * dP and P * delta, the two terms of each dS that cancel (exactly, where a row's probability is all on
        # one key): a kernel's rounding of dQ and dK grows with their squares, not with the result. Rebuilt in the
        # two block buffers, free now (P dP = dS + P delta; softcap's chain factor on both), so no third one.
        p_delta = probs.mul_(delta) if capped is None else probs.mul_(delta).view(b, hkv, g, n, sk).mul_(capped)
        terms = d_probs.add_(p_delta.view(bh, g * n, sk)).square_().addcmul_(probs, probs)
        dq_terms = torch.maximum(dq_terms, torch.bmm(terms, k_norms).max())
        dk_terms.baddbmm_(terms.transpose(1, 2), q_blk.square().sum(-1, keepdim=True))
    grad_views = (dq.reshape(b, h, sq, d), dk_t.transpose(1, 2).reshape(b, hkv, sk, d),
                  dv_t.transpose(1, 2).reshape(b, hkv, sk, dv_dim)) if grads else (None, None, None)
    # per entry: the squared norms summed over the head dim d, so / d; dS is kept / scale, so * scale
    terms = (("dq", case.scale * float(dq_terms / d) ** 0.5), ("dk", case.scale * float(dk_terms.max() / d) ** 0.5)
             ) if grads and sq and sk and device.type != "meta" else ()
    return Reference(out.reshape(b, h, sq, dv_dim), *grad_views, dsinks, dbias, terms)


def _one_slice(case: AttentionCase, inputs: Inputs, slopes, key_mask, only: tuple[int | None, int]):
    """The inputs, alibi slopes and key mask of one (batch, kv head) slice, with its query heads (batch None: every
    batch)."""
    batch, kv_head = only
    if not ((batch is None or 0 <= batch < case.batch) and 0 <= kv_head < case.kv_heads):
        raise ValueError(f"only={only}: allowed batch 0..{case.batch - 1} or None, kv head 0..{case.kv_heads - 1}")
    g = case.heads // case.kv_heads
    bs = slice(None) if batch is None else slice(batch, batch + 1)
    heads, kvs = slice(kv_head * g, (kv_head + 1) * g), slice(kv_head, kv_head + 1)
    bias = inputs.bias
    if bias is not None:
        bias = bias[bs if bias.shape[0] > 1 else slice(0, 1), heads]
    sliced = Inputs(inputs.q[bs, heads], inputs.k[bs, kvs], inputs.v[bs, kvs], inputs.d_out[bs, heads],
                    None if inputs.sinks is None else inputs.sinks[heads], bias)

    def mask_of(rows):
        mask = key_mask(rows=rows)
        return mask if mask is None or mask.shape[0] == 1 else mask[bs]

    return sliced, None if slopes is None else slopes[heads], mask_of
