"""Execution: running backends on cases (correctness, then the benchmark stage) within a run session."""
