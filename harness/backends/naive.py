"""Eager attention with materialized scores in the input dtype: the oracle's same-precision baseline, as a backend."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.backends.base import Backend, KnownFailure, MaskForm, Plan
from harness.backends.fp8_dequant import dequant_note, dequantized_inputs
from harness.backends.paged_gather import gather_paged
from harness.backends.registry import register
from harness.oracle.baseline import naive_attention, naive_rows
from harness.cases.masks import MaskSpec
from harness.cases.modifiers import MODIFIERS, alibi_bias, alibi_slopes
from harness.store.schema import BASELINE
from harness.backends.serving import ServingKnob


@dataclass
class NaivePlan(Plan):
    """The dense bool mask (B|1, 1, Sq, Sk) and the ALiBi term (H, Sq, Sk) or None, on the device."""

    allowed: torch.Tensor
    alibi: torch.Tensor | None


@register
class Naive(Backend):
    name = BASELINE
    colour, marker = "#7f7f7f", "o"
    library = "naive attention"
    #: transformers' own matmul + softmax (eager_attention_forward): modeling_utils.py of 4.36.0 to 5.25.0
    serving = (ServingKnob("transformers", "eager", "4.36.0", note="the model's own matmul and softmax"),)
    #: by design (the same-precision baseline): its fp16 scores and dO @ V^T stay in the input dtype
    known_failures = (
        KnownFailure("edge", "fp16-qk-overflow",
                     "naive computes q @ k^T in the input dtype before scaling (by design), so fp16 scores overflow"),
        KnownFailure("edge", "fp16-large-v",
                     "naive's autograd keeps dO @ V^T in the input dtype (by design), so the fp16 backward overflows"),
    )
    layout = "bhsd"
    deterministic = "eager matmul/softmax with a fixed reduction order"
    modifiers = frozenset(MODIFIERS)
    supports_head_dim_v = True
    paged_kv = True  # by gathering the pages through the block table, inside the timed call
    mixed_batch = True  # the dense mask: padding rows see no key and come out 0
    fp8_kv = True  # by dequantizing K and V inside the timed call
    #: dense, scores in memory: on an H200 its causal bf16 fwd+bwd (b4 h16 s4096 d128) ran 1.65 TFLOP in 37.0 ms
    #: against a 693 TFLOP/s GEMM; on the 2-core VM 0.04-0.066 (docs/measurements.md, "The whole job's estimate")
    relative_speed = {"cpu": 0.05, "cuda": 0.064}
    fp8_q = True  # and q

    def prepare(self, case, device) -> NaivePlan:
        """The dense bool mask and the ALiBi term in the case's dtype on the device, built once: the call attends."""
        alibi = (alibi_bias(alibi_slopes(case.heads).to(device), case.seq_q, case.seq_k).to(case.dtype)
                 if case.alibi else None)
        return NaivePlan(op=self.name + dequant_note(case, gathers=True), allowed=case.key_mask(device), alibi=alibi)

    def forward(self, q, k, v, *, mask: MaskSpec | None, scale: float, prepared: NaivePlan | None = None,
                softcap: float | None = None, sinks: torch.Tensor | None = None,
                alibi_slopes: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                block_table: torch.Tensor | None = None, cache_seqlens: torch.Tensor | None = None,
                k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                q_scale: torch.Tensor | None = None) -> torch.Tensor:
        if block_table is not None:  # paged: k, v are the caches; gather them, then attend as for any case
            k, v = gather_paged(k, v, block_table, cache_seqlens, mask, self.layout)
        if k_scale is not None:  # an FP8 cache (and q): dequantize (gathered first: the pages this call reads)
            q, k, v = dequantized_inputs(q, k, v, k_scale, v_scale, q_scale, self.layout)
        if prepared is None:  # called directly: build the mask from the tensors' own sizes
            return naive_attention(q, k, v, mask, scale, softcap=softcap, alibi_slopes=alibi_slopes, bias=bias,
                                   sinks=sinks)
        return naive_rows(q, k, v, prepared.allowed, scale, softcap=softcap, alibi=prepared.alibi, bias=bias,
                          sinks=sinks)

    def mask_form(self, case, device):
        return MaskForm.dense(case.key_mask(device), "materialized mask")  # what prepare builds
