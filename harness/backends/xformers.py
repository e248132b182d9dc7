"""xformers memory_efficient_attention (B, S, H, D): masks as attn_bias, ops chosen once by its dispatcher."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from harness.backends.base import Backend, BackwardUnsupported, MaskForm, Plan, Unsupported
from harness.backends.install import Install
from harness.backends.paged_gather import run_packed
from harness.backends.registry import register
from harness.backends.xformers_library import CUDA12_RUNTIME_PACKAGE, load_problem, xformers_kernels
from harness.cases.case import AttentionCase
from harness.cases.masks import Causal, CausalBottomRight, Documents, MaskSpec, SlidingWindow, split_padding
from harness.cases.modifiers import additive_term, alibi_slopes
from harness.cases.paged import paged_layout, query_rows
from harness.backends.serving import ServingKnob


def _padded_zeros(shape: tuple[int, ...], dtype, device) -> torch.Tensor:
    """Zeros of `shape` (..., Sk) in storage whose rows are padded to a multiple of 8: xformers' kernels want the
    bias rows aligned (they raise otherwise); the slice keeps the logical shape."""
    *lead, sk = shape
    return torch.zeros(*lead, (sk + 7) // 8 * 8, dtype=dtype, device=device)[..., :sk]


def _form_inputs(gqa: str, packed: bool, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: int) -> tuple:
    """q, k, v (B, S, H or Hkv, D) as a form passes them: GQA "5d" (B, S, Hkv, g, D) with K/V expanded (stride 0),
    "expand" K/V repeated to every head (autograd sums dK/dV back over the group); `packed`: the batch as one
    sequence (BlockDiagonal masks)."""
    if gqa == "5d":
        q = q.reshape(*q.shape[:2], k.shape[2], g, q.shape[-1])
        k, v = (t.unsqueeze(3).expand(*t.shape[:3], g, t.shape[-1]) for t in (k, v))
    elif gqa == "expand":
        k, v = (t.repeat_interleave(g, dim=2) for t in (k, v))
    if packed:
        q, k, v = (t.reshape(1, -1, *t.shape[2:]) for t in (q, k, v))
    return q, k, v


def xformers_bias(mask: MaskSpec | None, shape: tuple[int, ...], dtype=torch.float32, device="cpu"):
    """Mask spec -> xformers attn_bias of `shape` ((B, H, Sq, Sk), or (B, G, H, Sq, Sk) for 5-D GQA inputs): typed
    masks where xformers has one, a tensor bias of the whole mask when key padding is part of it (no backward op
    takes the padded-keys masks), Documents a BlockDiagonal mask over the batch packed into one sequence."""
    from xformers.ops.fmha import attn_bias as ab
    if isinstance(mask, Documents):
        return documents_bias(mask, shape[0], device)
    structural, pad = split_padding(mask)
    if pad is not None:
        if structural is not None and not isinstance(structural, (Causal, CausalBottomRight, SlidingWindow)):
            raise Unsupported(f"no xformers attn_bias for mask {structural.id}")
        return xformers_additive_bias(mask, shape, dtype, device)  # the mask as -inf, no modifiers
    if structural is None:
        return None
    if isinstance(structural, Causal):
        return ab.LowerTriangularMask()
    if isinstance(structural, CausalBottomRight):
        return ab.LowerTriangularFromBottomRightMask()
    if isinstance(structural, SlidingWindow):
        # -1 (unbounded) becomes a window wider than any key offset in this shape
        unbounded = shape[-2] + shape[-1]
        left, right = (unbounded if w < 0 else w for w in (structural.left, structural.right))
        return ab.LocalAttentionFromBottomRightMask(window_left=left, window_right=right)
    raise Unsupported(f"no xformers attn_bias for mask {structural.id}")


def xformers_additive_bias(mask: MaskSpec | None, shape: tuple[int, ...], dtype=torch.float32, device="cpu",
                           slopes: torch.Tensor | None = None) -> torch.Tensor:
    """The modifiers' constant part as one additive tensor attn_bias of `shape` ((B, H, Sq, Sk) or (B, G, H/G, Sq,
    Sk)): the ALiBi term plus the mask as -inf, rows padded; a bias input joins it in the call (`with_bias`)."""
    *lead, sq, sk = shape
    out = _padded_zeros(shape, dtype, device)
    constant = additive_term(mask, sq, sk, lead[0], dtype, device, slopes)    # (B|1, H|1, Sq, Sk)
    heads = lead[1:] if constant.shape[1] > 1 else [1] * (len(lead) - 1)       # H -> the heads' dims of `shape`
    out[...] = constant.reshape(constant.shape[0], *heads, sq, sk)            # broadcast into the padded storage
    return out


def with_bias(constant: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """constant + bias ((B|1, H, Sq, Sk), viewed in constant's head dims), rows padded to 8 again (differentiable)."""
    total = constant + bias.reshape(bias.shape[0], *constant.shape[1:])
    sk = total.shape[-1]
    return torch.nn.functional.pad(total, (0, (sk + 7) // 8 * 8 - sk))[..., :sk]


def documents_bias(mask: Documents, batch: int, device="cpu"):
    """Documents -> xformers BlockDiagonal mask whose blocks are every batch element's documents in order, inputs
    packed as (1, batch * seq, ...); causal ones of unequal lengths the FromBottomRight variant. The offsets live on
    `device` (from_seqlens defaults to "cuda", which is cuda:0, whatever device the run uses)."""
    from xformers.ops.fmha import attn_bias as ab
    q_lens, k_lens = list(mask.q_lengths) * batch, list(mask.k_lengths) * batch
    device = torch.device(device)
    if not mask.causal:
        return ab.BlockDiagonalMask.from_seqlens(q_lens, k_lens, device=device)
    if mask.q_lengths == mask.k_lengths:
        return ab.BlockDiagonalCausalMask.from_seqlens(q_lens, k_lens, device=device)
    try:
        return ab.BlockDiagonalCausalFromBottomRightMask.from_seqlens(q_lens, k_lens, device=device)
    except ValueError as exc:  # xformers: "Expected num_keys >= num_queries" per block
        raise Unsupported(f"xformers BlockDiagonalCausalFromBottomRightMask refuses {mask.id}: {exc}") from None


@dataclass
class Form:
    """One way of calling xformers on a case: the bias, the ops its dispatcher chose, how q/k/v are shaped."""

    bias: object
    fw: type | None
    bw: type | None
    gqa: str          # "none", "5d" (forward only) or "expand" (K/V repeated to every head)
    packed: bool      # Documents: the batch packed into one sequence
    paged: bool = False  # the physical paged cache as one sequence of slots
    #: a mixed serving step: the padded q's rows (batch * seq_q) that carry a query, int64 on the device
    rows: torch.Tensor | None = None

    def op_names(self) -> tuple[str, str]:
        """The (forward, backward) kernels the row records for a call of this form."""
        how = (" (paged block-diagonal bias over the physical cache)" if self.paged else
               " (GQA as 5-D, forward only)" if self.gqa == "5d" else
               " (GQA with K/V expanded to every head)" if self.gqa == "expand" else "")
        return _op_name(self.fw) + how, _op_name(self.bw)


@dataclass
class XformersPlan(Plan):
    """Both forms of a case (docs/design/backends.md); `backward_refused` says why there is no training form. A call
    with gradients runs the training form's kernels, else the inference form's."""

    inference: Form
    training: Form | None
    backward_refused: str = ""
    #: the inference form's forward kernel, for a reader of the plan alone
    op: str = field(default="", kw_only=True)

    def __post_init__(self):
        self.op = self.op or self.inference.op_names()[0]

    def ops(self, training: bool) -> tuple[str, str]:
        form = self.training if training and self.training is not None else self.inference
        return form.op_names()


def _op_name(op) -> str:
    if op is None:
        return "none"
    name = op.NAME
    if name.startswith("fa2"):  # which flash implementation runs underneath (xformers/ops/fmha/flash.py)
        from xformers.ops.fmha import flash
        source = "torch's bundled flash" if getattr(flash, "_USE_PT_FLASH_ATTN", False) else "the flash_attn package"
        name += f" ({source})"
    return f"xformers:{name}"


def _first_lines(exc: Exception, n: int = 6) -> str:
    return " | ".join(line.strip() for line in str(exc).strip().splitlines()[:n] if line.strip())


def xformers_plan(case: AttentionCase, device: torch.device,
                  tensor: Callable[..., torch.Tensor] = torch.empty) -> XformersPlan:
    """Choose the ops of both forms with xformers' own dispatcher (Unsupported when no forward op takes the case);
    `tensor(shape, dtype, device)` makes the stand-in q/k/v it inspects (tests pass fakes that look like CUDA)."""
    from xformers.ops import fmha
    b, h, hkv, sq, sk, d = case.batch, case.heads, case.kv_heads, case.seq_q, case.seq_k, case.head_dim
    g = h // hkv
    packed = isinstance(case.mask, Documents)
    if packed and case.modifiers:
        raise Unsupported("xformers: documents are packed BlockDiagonal masks; ALiBi/bias need a tensor bias")
    slopes = alibi_slopes(h) if case.alibi else None

    def form(gqa: str, needs_grad: bool) -> Form:
        shapes = (b, sq, h, d), (b, sk, hkv, d), (b, sk, hkv, case.head_dim_v)      # q, k, v
        q, k, v = _form_inputs(gqa, packed, *(tensor(s, dtype=case.dtype, device=device) for s in shapes), g)
        shape = (b, hkv, g, sq, sk) if gqa == "5d" else (b, h, sq, sk)
        if case.modifiers:  # the whole score transform as one tensor; requires grad where the bias input does
            bias = xformers_additive_bias(case.mask, shape, case.dtype, device, slopes)
            bias.requires_grad_(needs_grad and case.bias is not None)
        else:
            bias = xformers_bias(case.mask, shape, case.dtype, device)
        inp = fmha.Inputs(query=q, key=k, value=v, attn_bias=bias, scale=case.scale)
        try:
            fw = fmha.dispatch._dispatch_fw(inp, needs_grad)
        except NotImplementedError as exc:
            raise Unsupported(f"no xformers forward op: {_first_lines(exc)[:600]}") from None
        bw = None
        if needs_grad:
            varlen = isinstance(bias, fmha.attn_bias.VARLEN_BIASES) and bias.q_seqinfo.seqstart.shape[0] > 2
            try:
                bw = fmha.dispatch._dispatch_bw(inp, varlen_lse_packed=fw.VARLEN_LSE_PACKED if varlen else None)
            except NotImplementedError as exc:
                raise BackwardUnsupported(f"no xformers backward op: {_first_lines(exc)[:600]}") from None
        return Form(bias, fw, bw, gqa, packed)

    inference = form("5d" if g > 1 else "none", needs_grad=False)
    try:
        return XformersPlan(inference, form("expand" if g > 1 else "none", needs_grad=True))
    except BackwardUnsupported as exc:
        return XformersPlan(inference, None, str(exc))


def xformers_paged_bias(case: AttentionCase, block_table: torch.Tensor, device="cpu"):
    """CacheCausal over a block table -> PagedBlockDiagonalCausalWithOffsetPaddedKeysMask (offsets on `device`)."""
    from xformers.ops.fmha import attn_bias as ab
    q_seqlen = list(case.mask.q_lens) if case.mask.mixed else [case.seq_q] * case.batch   # a mixed step's own
    return ab.PagedBlockDiagonalCausalWithOffsetPaddedKeysMask.from_seqlens(
        q_seqlen, list(case.mask.lengths), block_table, case.page_size, device=torch.device(device))


def xformers_paged_plan(case: AttentionCase, device: torch.device,
                        tensor: Callable[..., torch.Tensor] = torch.empty,
                        block_table: torch.Tensor | None = None) -> Form:
    """A paged case's inference form: PagedBlockDiagonalCausalWithOffsetPaddedKeysMask (query i of block b sees keys
    j <= kv_seqlen[b] - q_seqlen[b] + i, i.e. CacheCausal), q packed as (1, batch * seq_q, heads, head_dim) (5-D with
    GQA), K/V the physical cache as (1, num_blocks * page_size, kv_heads, head_dim)."""
    from xformers.ops import fmha
    layout = paged_layout(case, device)
    table = layout.block_table if block_table is None else block_table
    b, h, hkv, sq, d = case.batch, case.heads, case.kv_heads, case.seq_q, case.head_dim
    g, slots = h // hkv, layout.num_blocks * case.page_size
    bias = xformers_paged_bias(case, table, device)
    # a mixed step: q packed by the per-sequence query lengths (the bias's q_seqlen)
    rows = query_rows(case).to(device) if case.mask.mixed else None
    tokens = b * sq if rows is None else rows.numel()
    gqa = "5d" if g > 1 else "none"
    k = tensor((1, slots, hkv, d), dtype=case.dtype, device=device)
    q, k, _ = _form_inputs(gqa, False, tensor((1, tokens, h, d), dtype=case.dtype, device=device), k, k, g)
    try:
        fw = fmha.dispatch._dispatch_fw(fmha.Inputs(query=q, key=k, value=k, attn_bias=bias, scale=case.scale), False)
    except NotImplementedError as exc:
        raise Unsupported(f"no xformers forward op for the paged bias: {_first_lines(exc, 12)[:600]}") from None
    return Form(bias, fw, None, gqa, True, paged=True, rows=rows)


@register
class Xformers(Backend):
    name = "xformers"
    colour, marker = "#8c564b", "p"
    #: without its dependencies, so it never replaces a torch; beside a CUDA 13 torch the CUDA 12 runtime its _C.so links
    #: vLLM XFORMERS: selectable by VLLM_ATTENTION_BACKEND up to 0.11.1 (removed in 0.12.0), never a CUDA default
    serving = (ServingKnob("vllm", "XFORMERS", "0.10.2", until="0.11.1"),)
    install = Install("xformers==0.0.35", because="its ops/fmha dispatcher and attn_bias masks are what the translation "
                      "here was read against; the wheel is built on torch's stable ABI, so any torch >= 2.10 loads it",
                      no_deps_with=(), cuda_companions={13: (CUDA12_RUNTIME_PACKAGE,)})
    layout = "bshd"
    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    package = "xformers"
    native_probes = frozenset({"causal", "mask", "dropout"})
    #: ALiBi and the bias input as one additive tensor attn_bias (the mask folded in); the dispatcher picks the op
    modifiers = frozenset({"alibi", "bias"})
    modifier_refusals = {"softcap": "xformers 0.0.35's memory_efficient_attention has no softcap",
                         "sinks": "xformers 0.0.35's memory_efficient_attention has no sink logit"}
    supports_head_dim_v = True
    #: paged through PagedBlockDiagonalCausalWithOffsetPaddedKeysMask, dispatched (0.0.35, sm80/sm90) to fa2F over
    #: the flash_attn package's fwd_kvcache (ops/fmha/flash.py 415-423, 636-656), pages a multiple of 256
    paged_kv = True
    page_size_multiple = 256
    mixed_batch = True  # the same paged bias with each sequence's own q_seqlen

    def unavailable_reason(self, device):
        problem = load_problem()
        if problem and "not importable" in problem:
            return problem
        if device.type != "cuda":
            return f"xformers kernels need CUDA; device is {device.type}"
        return problem

    def kernels(self) -> str:
        try:
            return xformers_kernels()
        except Exception:  # not importable: unavailable_reason says why
            return ""

    def prepare(self, case: AttentionCase, device: torch.device,
                block_table: torch.Tensor | None = None) -> XformersPlan:
        """Both forms, ops chosen by xformers' dispatcher; a paged case's over `block_table` (default: the case's)."""
        if case.page_size is not None:
            return XformersPlan(xformers_paged_plan(case, device, block_table=block_table), None,
                                "paged KV is forward-only")
        return xformers_plan(case, device)

    def mask_form(self, case, device):
        group = case.heads // case.kv_heads
        shape = ((case.batch, case.kv_heads, group, case.seq_q, case.seq_k) if group > 1
                 else (case.batch, case.heads, case.seq_q, case.seq_k))  # the inference form's bias shape
        bias = xformers_bias(case.mask, shape, case.dtype, device)
        if isinstance(bias, torch.Tensor):
            return MaskForm.dense(bias, "tensor attn_bias")
        return MaskForm("native", 0, type(bias).__name__)

    def native_causal(self, q, k, v, *, scale):  # no causal flag: LowerTriangularMask is its docs' "causal"
        import xformers.ops as xops
        from xformers.ops.fmha import attn_bias as ab
        return xops.memory_efficient_attention(q, k, v, attn_bias=ab.LowerTriangularMask(), scale=scale)

    def native_mask(self, q, k, v, *, mask, scale):
        """`mask` (B|1, H|1, Sq, Sk), bool or additive (in rows padded to 8, as xformers requires), as attn_bias."""
        import xformers.ops as xops
        b, sq, h, _ = q.shape
        full = mask.expand(b, h, sq, k.shape[1])
        if mask.dtype != torch.bool:
            full = _padded_zeros(full.shape, q.dtype, q.device).copy_(full)
        return xops.memory_efficient_attention(q, k, v, attn_bias=full, scale=scale)

    def native_dropout(self, q, k, v, *, p, scale):
        import xformers.ops as xops
        return xops.memory_efficient_attention(q, k, v, p=p, scale=scale)

    def modifier_path(self, case):
        return "tensor attn_bias (" + " + ".join([m for m in ("alibi", "bias") if m in case.modifiers]
                                                 + (["mask"] if case.mask is not None else [])) + ")"

    def forward(self, q, k, v, *, mask, scale, prepared: XformersPlan | None = None, alibi_slopes=None, bias=None,
                block_table=None, cache_seqlens=None):
        import xformers.ops as xops
        plan = self.plan_for(prepared, q, k, v, mask=mask, scale=scale, alibi_slopes=alibi_slopes, bias=bias,
                             block_table=block_table)
        b, sq, h, d = q.shape
        g = h // k.shape[2]
        if block_table is not None:  # paged: the physical cache as one sequence of slots, q packed
            form = plan.inference
            k, v = (t.flatten(0, 1).unsqueeze(0) for t in (k, v))            # (1, num_blocks * P, Hkv, D)

            def call(x):  # (tokens, H, D) -> (tokens, H, D)
                q_g, k_g, v_g = _form_inputs(form.gqa, False, x.unsqueeze(0), k, v, g)
                out = xops.memory_efficient_attention_forward(q_g, k_g, v_g, attn_bias=form.bias, scale=scale,
                                                              op=form.fw)
                return out.reshape(x.shape[0], h, d)

            if form.rows is not None:  # a mixed step: only the rows that carry queries, packed
                return run_packed(q, form.rows, call)
            return call(q.reshape(b * sq, h, d)).reshape(b, sq, h, d)
        training = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        if training and plan.training is None:
            raise BackwardUnsupported(plan.backward_refused)
        form = plan.training if training else plan.inference
        q, k, v = _form_inputs(form.gqa, form.packed, q, k, v, g)
        attn_bias = form.bias if bias is None else with_bias(form.bias.detach(), bias)
        out = xops.memory_efficient_attention(q, k, v, attn_bias=attn_bias, scale=scale, op=(form.fw, form.bw))
        return out.reshape(b, sq, h, v.shape[-1])
