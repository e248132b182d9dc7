"""Eager attention with materialized scores in the input dtype: the oracle's same-precision baseline, as a backend."""

from __future__ import annotations

import torch

from harness.backends.base import Backend, MaskForm
from harness.backends.registry import register
from harness.oracle.baseline import naive_attention
from harness.spec.masks import MaskSpec


@register
class Naive(Backend):
    name = "naive"
    layout = "bhsd"
    deterministic = "eager matmul/softmax with a fixed reduction order"

    def forward(self, q, k, v, *, mask: MaskSpec | None, scale: float) -> torch.Tensor:
        return naive_attention(q, k, v, mask, scale)

    def mask_form(self, case, device):
        return MaskForm.dense(case.key_mask(device), "materialized mask")  # the spec, materialized in forward
