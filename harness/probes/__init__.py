"""Probes beyond the case matrix: semantics questions, edge cases, empty tensors, dropout, determinism, KV cache."""
