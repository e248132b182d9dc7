"""Launching a run over several devices or machines: sharding, local processes, Slurm arrays, and the merge."""
