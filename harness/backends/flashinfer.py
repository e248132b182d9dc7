"""FlashInfer's batch wrappers (ragged prefill, paged decode / verification), NHD: plan() in prepare, run() timed."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

import torch

from harness.backends.base import FlashFamily, MaskForm, Plan, Unsupported, refusal
from harness.backends.flash_attn import fa2_plan
from harness.backends.install import Install
from harness.backends.paged_gather import run_packed
from harness.backends.registry import register
from harness.cases.case import AttentionCase
from harness.cases.fp8 import kv_scales
from harness.cases.masks import Causal, CausalBottomRight, Documents, KeyPadding, MaskSpec, SlidingWindow
from harness.cases.paged import cu_seqlens, paged_layout, query_rows
from harness.backends.serving import ServingKnob

#: bytes of the float workspace every wrapper takes (FlashInfer's examples and tests use 128 MiB)
WORKSPACE_BYTES = 128 * 2 ** 20


def flashinfer_mask(mask: MaskSpec | None, seq_q: int, seq_k: int) -> dict:
    """Mask spec -> {causal, window_left} of a ragged prefill request (+ 'key_lengths' for key padding).
    FlashInfer's causal is bottom-right within each request (prefill.cuh: masked when kv_idx + qo_len > kv_len +
    q_idx) and its window is left of that diagonal (variants.cuh: kept when kv_idx + qo_len + window_left >= kv_len +
    qo_idx); so top-left causal matches only when seq_q == seq_k, and a window must end on the diagonal."""
    if mask is None:
        return {"causal": False, "window_left": -1}
    if isinstance(mask, CausalBottomRight) or (isinstance(mask, Causal) and seq_q == seq_k):
        return {"causal": True, "window_left": -1}
    if isinstance(mask, SlidingWindow) and mask.right == 0:
        return {"causal": True, "window_left": mask.left}
    if isinstance(mask, KeyPadding):
        return {"causal": False, "window_left": -1, "key_lengths": mask.lengths}
    if isinstance(mask, Documents):
        return {"causal": mask.causal, "window_left": -1}
    raise Unsupported(f"FlashInfer has no form for mask {mask.id} (causal is bottom-right per request, windows end "
                      "on the diagonal)")


def paged_plan_args(block_table: torch.Tensor, lengths: torch.Tensor, page_size: int, seq_q: int,
                    q_lens: tuple[int, ...] | None = None) -> dict:
    """The paged-KV plan() arguments of FlashInfer's CSR page format, int32 on the CPU: request b owns pages
    kv_indices[kv_indptr[b]:kv_indptr[b+1]] (its block-table row's first ceil(length_b / page_size)), its last holding
    kv_last_page_len[b] keys (1..page_size); qo_indptr packs seq_q queries a request (q_lens[b] in a mixed step)."""
    lengths = lengths.to("cpu", torch.int64)
    pages = (lengths + page_size - 1) // page_size
    owned = torch.arange(block_table.shape[1]).view(1, -1) < pages.view(-1, 1)
    batch = lengths.shape[0]
    return {"qo_indptr": cu_seqlens(q_lens if q_lens is not None else (seq_q,) * batch),
            "kv_indptr": cu_seqlens(pages),
            "kv_indices": block_table.to("cpu")[owned].to(torch.int32),
            "kv_last_page_len": (lengths - (pages - 1) * page_size).to(torch.int32)}


@dataclass
class FlashInferPlan(Plan):
    """What plan() was given, on the CPU (kind: decode, paged-prefill or ragged), and the planned wrapper."""

    kind: str
    args: dict
    causal: bool = False
    window_left: int = -1
    wrapper: object = None
    keep: torch.Tensor | None = field(default=None, repr=False)
    #: a mixed serving step: the padded q's rows (batch * seq_q) that carry a query, int64, packed in request order
    rows: torch.Tensor | None = field(default=None, repr=False)
    #: an FP8 cache's (k_scale, v_scale) as floats, read once here, for run() (flashinfer-python 0.6.1)
    kv_scales: tuple[float, float] | None = None


def flashinfer_plan(case: AttentionCase, block_table: torch.Tensor | None = None) -> FlashInferPlan:
    """The wrapper and plan() arguments of `case` (no FlashInfer import); a paged case is a decode (one query, the
    whole cache) or a verification (the paged prefill wrapper with causal=True: bottom-right, i.e. CacheCausal)."""
    scales = None
    if case.fp8_kv is not None:
        if case.fp8_kv != "tensor":
            raise Unsupported("FlashInfer takes one k_scale and one v_scale per tensor (flashinfer-python 0.6.1 run(): "
                              "sm_scale *= k_scale, out *= v_scale); per-head scales have no form")
        if case.page_size is None:
            raise Unsupported("FlashInfer's FP8 KV path here is its paged wrappers'; a contiguous FP8 case is not "
                              "translated")
        scales = tuple(float(s) for s in kv_scales(case.kv_heads, case.fp8_kv))
    if case.page_size is not None:
        table = paged_layout(case).block_table if block_table is None else block_table
        mixed = case.mask.q_lens if case.mask.mixed else None
        args = paged_plan_args(table, case.mask.lengths_tensor(), case.page_size, case.seq_q, mixed)
        kind = "decode" if case.seq_q == 1 else "paged-prefill"
        rows = None if mixed is None else query_rows(case)  # the padded q's rows that hold queries
        return FlashInferPlan(kind, args, causal=case.seq_q > 1, op=f"flashinfer:{kind}" + (
            " (q packed by qo_indptr and scattered back inside the timed call)" if mixed else ""), rows=rows,
            kv_scales=scales)
    mask = flashinfer_mask(case.mask, case.seq_q, case.seq_k)
    if isinstance(case.mask, Documents) and mask["causal"] and any(
            k < q for q, k in zip(case.mask.q_lengths, case.mask.k_lengths)):
        raise Unsupported(f"FlashInfer causal needs kv_len >= qo_len in every request (prefill.cuh); {case.mask.id}")
    # qo_indptr / kv_indptr (int32) of the case's requests, and `keep` (int64 indices of the kept keys in the flattened
    # (batch * seq_k) keys, or None): FA2's varlen cu_seqlens exactly (flash_attn.fa2_plan)
    varlen, b, sq, sk = fa2_plan(case, "cpu"), case.batch, case.seq_q, case.seq_k
    if varlen["mode"] == "varlen":
        args, keep = {"qo_indptr": varlen["cu_q"], "kv_indptr": varlen["cu_k"]}, varlen["keep"]
    else:
        args, keep = {"qo_indptr": torch.arange(0, (b + 1) * sq, sq, dtype=torch.int32),
                      "kv_indptr": torch.arange(0, (b + 1) * sk, sk, dtype=torch.int32)}, None
    return FlashInferPlan("ragged", args, mask["causal"], mask["window_left"], keep=keep, op="flashinfer:ragged")


def jit_problem() -> str | None:
    """Why FlashInfer cannot build its kernels here: no nvcc where jit/cpp_ext.py get_cuda_path looks, and no
    prebuilt flashinfer-jit-cache (flashinfer/jit/env.py)."""
    import importlib.util
    if importlib.util.find_spec("flashinfer_jit_cache") is not None:
        return None
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [os.path.join(home, "bin", "nvcc")] if home else []
    candidates += [p for p in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc") if p]
    if any(os.path.exists(p) for p in candidates):
        return None
    return ("FlashInfer JIT-compiles its kernels with nvcc at first use: no nvcc (CUDA_HOME, CUDA_PATH, PATH, "
            "/usr/local/cuda) and no flashinfer-jit-cache installed")


@register
class FlashInfer(FlashFamily):
    name = "flashinfer"
    colour, marker = "#bcbd22", "h"
    library = "FlashInfer"
    #: vLLM FLASHINFER (0.10.2 on; the default on sm100), SGLang flashinfer (0.4.6.post4 on; its trtllm_mha runs
    #: FlashInfer's TensorRT-LLM kernels instead); transformers has no FlashInfer setting
    serving = (ServingKnob("vllm", "FLASHINFER", "0.10.2"),
               ServingKnob("sglang", "flashinfer", "0.4.6.post4"))
    #: without its dependencies, which pull in the CUTLASS DSL (hundreds of MiB) that only its JIT on a GPU uses: on a
    #: CPU its wrappers import and their translation is tested; with what its import needs
    install = Install("flashinfer-python==0.6.1", because="its wrappers' plan()/run() were read at 0.6.1; 7.6 MB where "
                      "0.7.x is ~62 MB (pip download --no-deps, docs/serving.md)",
                      no_deps_with=("apache-tvm-ffi==0.1.15.post2", "einops", "tabulate", "nvidia-ml-py", "tqdm",
                                    "click", "ninja", "requests", "urllib3", "idna", "certifi", "charset-normalizer"))
    package = "flashinfer-python"
    version_name = "flashinfer"
    supports_backward = False  # FlashInfer is an inference library: its wrappers have no backward
    paged_kv = True  # the block table's pages in FlashInfer's CSR form
    mixed_batch = True  # the paged prefill wrapper with qo_indptr from the per-sequence query lengths
    fp8_kv = True  # paged caches with per-tensor scales (kv_data_type float8_e4m3fn, run(k_scale=, v_scale=))

    def unavailable_reason(self, device):
        try:
            import flashinfer  # noqa: F401
        except Exception as exc:
            return f"flashinfer not importable ({type(exc).__name__}: {exc}); pip install flashinfer-python"
        if device.type != "cuda":
            return f"FlashInfer kernels need CUDA; device is {device.type}"
        return jit_problem()

    def not_supported_reasons(self, case):
        return super().not_supported_reasons(case) + refusal(flashinfer_plan, case)

    def mask_form(self, case, device):
        plan = flashinfer_plan(case)
        return MaskForm("native", 0, f"{plan.kind}: causal={plan.causal}, window_left={plan.window_left}")

    def prepare(self, case: AttentionCase, device: torch.device, block_table: torch.Tensor | None = None):
        """The wrapper, planned once on the device: plan() copies the indptr arrays and schedules the work."""
        import flashinfer
        plan = flashinfer_plan(case, block_table)
        plan.rows = None if plan.rows is None else plan.rows.to(device)
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        args = {k: v.to(device) for k, v in plan.args.items()}
        kv_dtype = case.dtype if case.fp8_kv is None else torch.float8_e4m3fn
        common = dict(q_data_type=case.dtype, kv_data_type=kv_dtype, sm_scale=case.scale, window_left=plan.window_left)
        if plan.kind == "decode":
            plan.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
            plan.wrapper.plan(args["kv_indptr"], args["kv_indices"], args["kv_last_page_len"], case.heads,
                              case.kv_heads, case.head_dim, case.page_size, **common)
        elif plan.kind == "paged-prefill":
            plan.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
            plan.wrapper.plan(args["qo_indptr"], args["kv_indptr"], args["kv_indices"], args["kv_last_page_len"],
                              case.heads, case.kv_heads, case.head_dim, case.page_size, causal=True, **common)
        else:
            plan.wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, kv_layout="NHD")
            plan.wrapper.plan(args["qo_indptr"], args["kv_indptr"], case.heads, case.kv_heads, case.head_dim,
                              causal=plan.causal, **common)
            plan.keep = None if plan.keep is None else plan.keep.to(device)
        return plan

    def forward(self, q, k, v, *, mask, scale, prepared: FlashInferPlan | None = None, block_table=None,
                cache_seqlens=None, k_scale=None, v_scale=None):
        b, sq, h, d = q.shape
        prepared = self.plan_for(prepared, q, k, v, mask=mask, scale=scale, block_table=block_table)
        # an FP8 cache: the case's scales as floats from the plan (no device read in the timed call)
        fp8 = {} if prepared.kv_scales is None else dict(zip(("k_scale", "v_scale"), prepared.kv_scales))
        if prepared.kind == "decode":  # q (batch, heads, head_dim); the caches as they are (NHD pages)
            return prepared.wrapper.run(q.reshape(b, h, d), (k, v), **fp8).reshape(b, 1, h, d)
        if prepared.rows is not None:  # a mixed step: q packed by qo_indptr
            return run_packed(q, prepared.rows, lambda packed: prepared.wrapper.run(packed, (k, v), **fp8))
        if prepared.kind == "paged-prefill":
            return prepared.wrapper.run(q.reshape(b * sq, h, d), (k, v), **fp8).reshape(b, sq, h, d)
        k_flat, v_flat = k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])  # (batch * seq_k, kv_heads, D)
        if prepared.keep is not None:  # key padding: only each sequence's valid keys, packed
            k_flat, v_flat = k_flat.index_select(0, prepared.keep), v_flat.index_select(0, prepared.keep)
        return prepared.wrapper.run(q.reshape(b * sq, h, d), k_flat, v_flat).reshape(b, sq, h, d)
