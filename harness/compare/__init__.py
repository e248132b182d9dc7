"""Comparing runs: per-key decisions, the regression gate over two runs, its report, and the history of runs."""
