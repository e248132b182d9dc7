"""Eager attention with materialized scores in the input dtype: the oracle's same-precision baseline, as a backend."""

from __future__ import annotations

import torch

from harness.backends.base import Backend, MaskForm
from harness.backends.registry import register
from harness.oracle.baseline import naive_attention, naive_rows
from harness.spec.masks import MaskSpec


@register
class Naive(Backend):
    name = "naive"
    layout = "bhsd"
    deterministic = "eager matmul/softmax with a fixed reduction order"

    def prepare(self, case, device) -> dict:
        """The dense bool mask (B|1, 1, Sq, Sk) on the device, built once: the call only attends."""
        return {"allowed": case.key_mask(device)}

    def forward(self, q, k, v, *, mask: MaskSpec | None, scale: float, prepared: dict | None = None) -> torch.Tensor:
        if prepared is None:  # called directly: build the mask from the tensors' own sizes
            return naive_attention(q, k, v, mask, scale)
        return naive_rows(q, k, v, prepared["allowed"], scale)

    def mask_form(self, case, device):
        return MaskForm.dense(case.key_mask(device), "materialized mask")  # what prepare builds
