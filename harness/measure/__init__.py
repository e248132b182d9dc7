"""Measurement: timing (CUDA events or a monotonic clock), CUDA graphs, peak memory, FLOPs, roofline, statistics."""
