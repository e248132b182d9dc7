"""Eager attention with materialized scores in the input dtype: the oracle's same-precision baseline, as a backend."""

from __future__ import annotations

import torch

from harness.backends.base import Backend, MaskForm
from harness.backends.paged_gather import GATHER_NOTE, gather_paged
from harness.backends.registry import register
from harness.oracle.baseline import naive_attention, naive_rows
from harness.spec.masks import MaskSpec


@register
class Naive(Backend):
    name = "naive"
    layout = "bhsd"
    deterministic = "eager matmul/softmax with a fixed reduction order"
    paged_kv = True  # by gathering the pages through the block table, inside the timed call

    def __init__(self):
        self._last_op = self.name

    def last_op(self) -> str:
        return self._last_op

    def prepare(self, case, device) -> dict:
        """The dense bool mask (B|1, 1, Sq, Sk) on the device, built once: the call only attends."""
        return {"allowed": case.key_mask(device)}

    def forward(self, q, k, v, *, mask: MaskSpec | None, scale: float, prepared: dict | None = None,
                block_table: torch.Tensor | None = None, cache_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        self._last_op = self.name if block_table is None else f"{self.name} ({GATHER_NOTE})"
        if block_table is not None:  # paged: k, v are the caches; gather them, then attend as for any case
            k, v = gather_paged(k, v, block_table, cache_seqlens, mask, self.layout)
        if prepared is None:  # called directly: build the mask from the tensors' own sizes
            return naive_attention(q, k, v, mask, scale)
        return naive_rows(q, k, v, prepared["allowed"], scale)

    def mask_form(self, case, device):
        return MaskForm.dense(case.key_mask(device), "materialized mask")  # what prepare builds
