"""xformers memory_efficient_attention, layout (B, S, H, D); GQA as (B, S, G, H, D); records the op that ran."""

from __future__ import annotations

import torch

from harness.backends.base import Backend, MaskForm, Unsupported
from harness.backends.registry import register
from harness.spec.masks import Causal, CausalBottomRight, Documents, KeyPadding, MaskSpec, SlidingWindow, split_padding


def _padding_bias(pad: KeyPadding, shape: tuple[int, ...], dtype, device) -> torch.Tensor:
    """Additive bias (0 / -inf) for key padding, shape (B, ..., Sq, Sk).

    Allocated with the last dim rounded up to 8 and sliced, because xformers' kernels want the bias rows
    aligned (it raises otherwise); the slice keeps the logical shape.
    """
    *lead, sq, sk = shape
    storage = torch.zeros(*lead, sq, (sk + 7) // 8 * 8, dtype=dtype, device=device)
    bias = storage[..., :sk]
    keep = pad.materialize(sq, sk, device, batch=lead[0])                   # (B, 1, Sq, Sk)
    keep = keep.reshape(lead[0], *([1] * (len(lead) - 1)), sq, sk)
    bias.masked_fill_(~keep.expand(*lead, sq, sk), float("-inf"))
    return bias


def xformers_bias(mask: MaskSpec | None, shape: tuple[int, ...], dtype=torch.float32, device="cpu"):
    """Mask spec -> xformers attn_bias: typed masks where xformers has one, a tensor bias for padding.

    `shape` is the bias shape xformers expects: (B, H, Sq, Sk), or (B, G, H, Sq, Sk) for GQA inputs.
    Documents become a BlockDiagonal mask over the batch packed into one sequence (see `documents_bias`).
    """
    from xformers.ops.fmha import attn_bias as ab

    if isinstance(mask, Documents):
        return documents_bias(mask, shape[0])
    structural, pad = split_padding(mask)
    if structural is None:
        typed = None
    elif isinstance(structural, Causal):
        typed = ab.LowerTriangularMask()
    elif isinstance(structural, CausalBottomRight):
        typed = ab.LowerTriangularFromBottomRightMask()
    elif isinstance(structural, SlidingWindow):
        # -1 (unbounded) becomes a window wider than any key offset in this shape
        unbounded = shape[-2] + shape[-1]
        left, right = (unbounded if w < 0 else w for w in (structural.left, structural.right))
        typed = ab.LocalAttentionFromBottomRightMask(window_left=left, window_right=right)
    else:
        raise Unsupported(f"no xformers attn_bias for mask {structural.id}")
    if pad is None:
        return typed
    bias = _padding_bias(pad, shape, dtype, device)
    if typed is None:
        return bias
    if isinstance(typed, ab.LowerTriangularMask) and type(typed) is ab.LowerTriangularMask:
        return ab.LowerTriangularMaskWithTensorBias(bias)
    raise Unsupported(f"xformers has no typed mask for {structural.id} combined with a tensor bias")


def documents_bias(mask: Documents, batch: int):
    """Documents -> xformers BlockDiagonal mask whose blocks are every batch element's documents in order.

    Inputs then go in packed as (1, batch * seq, ...). Causal documents of equal query and key lengths use
    BlockDiagonalCausalMask (top-left per block, the same there); unequal ones the FromBottomRight variant,
    which refuses a document with fewer keys than queries.
    """
    from xformers.ops.fmha import attn_bias as ab

    q_lens, k_lens = list(mask.q_lengths) * batch, list(mask.k_lengths) * batch
    if not mask.causal:
        return ab.BlockDiagonalMask.from_seqlens(q_lens, k_lens)
    if mask.q_lengths == mask.k_lengths:
        return ab.BlockDiagonalCausalMask.from_seqlens(q_lens, k_lens)
    try:
        return ab.BlockDiagonalCausalFromBottomRightMask.from_seqlens(q_lens, k_lens)
    except ValueError as exc:  # xformers: "Expected num_keys >= num_queries" per block
        raise Unsupported(f"xformers BlockDiagonalCausalFromBottomRightMask refuses {mask.id}: {exc}") from None


@register
class Xformers(Backend):
    name = "xformers"
    layout = "bshd"
    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    package = "xformers"
    native_probes = frozenset({"causal", "mask", "dropout"})

    def __init__(self):
        self._last_op = "xformers"

    def unavailable_reason(self, device):
        try:
            import xformers.ops  # noqa: F401
        except Exception as exc:
            return f"xformers not importable: {type(exc).__name__}: {exc} (pip install 'attention-harness[xformers]')"
        if device.type != "cuda":
            return f"xformers kernels need CUDA; device is {device.type}"
        return None

    def last_op(self) -> str:
        return self._last_op

    # Native probes (harness/probes/semantics.py, dropout.py): xformers' own arguments, no mask spec involved.
    def native_causal(self, q, k, v, *, scale):
        """xformers has no causal flag; LowerTriangularMask is the mask its docs use for "causal"."""
        import xformers.ops as xops
        from xformers.ops.fmha import attn_bias as ab

        return xops.memory_efficient_attention(q, k, v, attn_bias=ab.LowerTriangularMask(), scale=scale)

    def native_mask(self, q, k, v, *, mask, scale):
        """`mask` (B|1, H|1, Sq, Sk), bool or additive, passed as attn_bias; additive ones go in storage whose
        rows are padded to a multiple of 8, as xformers requires, so only the kind of mask is under test."""
        import xformers.ops as xops

        b, sq, h, _ = q.shape
        full = mask.expand(b, h, sq, k.shape[1])
        if mask.dtype != torch.bool:
            storage = torch.zeros(b, h, sq, (k.shape[1] + 7) // 8 * 8, dtype=q.dtype, device=q.device)
            full = storage[..., :k.shape[1]].copy_(full)
        return xops.memory_efficient_attention(q, k, v, attn_bias=full, scale=scale)

    def native_dropout(self, q, k, v, *, p, scale):
        import xformers.ops as xops

        return xops.memory_efficient_attention(q, k, v, p=p, scale=scale)

    def mask_form(self, case, device):
        group = case.heads // case.kv_heads
        shape = ((case.batch, case.kv_heads, group, case.seq_q, case.seq_k) if group > 1
                 else (case.batch, case.heads, case.seq_q, case.seq_k))  # the bias shapes forward builds
        bias = xformers_bias(case.mask, shape, case.dtype, device)
        if isinstance(bias, torch.Tensor):
            return MaskForm.dense(bias, "tensor attn_bias")
        tensors = [t for t in vars(bias).values() if isinstance(t, torch.Tensor)] if hasattr(bias, "__dict__") else []
        if tensors:  # a typed mask carrying a tensor bias (causal + padding): the tensor part is dense
            dense = sum(MaskForm.dense(t, "").dense_bytes for t in tensors)
            return MaskForm("dense", dense, f"{type(bias).__name__} with a tensor bias {tuple(tensors[0].shape)}")
        return MaskForm("native", 0, type(bias).__name__)

    def forward(self, q, k, v, *, mask, scale):
        import xformers.ops as xops
        from xformers.ops import fmha

        b, sq, h, d = q.shape
        sk, hkv = k.shape[1], k.shape[2]
        if hkv != h:  # xformers GQA: (B, S, G, H/G, D) with K/V expanded (stride 0) over the group
            g = h // hkv
            q = q.reshape(b, sq, hkv, g, d)
            k = k.unsqueeze(3).expand(b, sk, hkv, g, d)
            v = v.unsqueeze(3).expand(b, sk, hkv, g, d)
            shape = (b, hkv, g, sq, sk)
        else:
            shape = (b, h, sq, sk)
        bias = xformers_bias(mask, shape, q.dtype, q.device)
        if isinstance(mask, Documents):  # BlockDiagonal masks take the batch packed into one sequence
            q, k, v = (t.reshape(1, -1, *t.shape[2:]) for t in (q, k, v))
        inp = fmha.Inputs(query=q, key=k, value=v, attn_bias=bias, scale=scale)
        try:
            op = fmha.dispatch._dispatch_fw(inp, torch.is_grad_enabled() and q.requires_grad)
            self._last_op = f"xformers:{op.NAME}"
        except Exception as exc:  # xformers lists every op with its reasons here
            raise Unsupported(f"no xformers op: {str(exc)[:400]}") from None
        out = xops.memory_efficient_attention(q, k, v, attn_bias=bias, scale=scale)
        return out.reshape(b, sq, h, d)
