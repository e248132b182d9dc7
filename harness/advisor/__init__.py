"""The deployment advisor: which verified backend to ship for a workload, with ties, exclusions and checks."""
