"""Attention harness: check and benchmark attention backends against an exact float64 reference."""

from harness.api import check
from harness.backends.base import Backend, BackwardUnsupported, Plan, Unsupported
from harness.backends.registry import all_backends, get_backends, load_backend_module, register
from harness.execution import plugin_host  # noqa: F401 - gives load_backend_module its process (registry._DECLARER)
from harness.oracle.reference import reference_attention
from harness import masks, recommend
from harness.spec.case import AttentionCase, Inputs, make_inputs
from harness.masks import Causal, CausalBottomRight, KeyPadding, SlidingWindow
from harness.store.load import load_results

__all__ = ["AttentionCase", "Backend", "BackwardUnsupported", "Causal", "CausalBottomRight", "Inputs", "KeyPadding",
           "Plan", "SlidingWindow",
           "Unsupported", "all_backends", "check", "get_backends", "load_backend_module", "load_results",
           "make_inputs", "masks", "recommend", "reference_attention", "register"]
