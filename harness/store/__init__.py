"""Storage: the results schema, the one row builder, the append-only writers, loading and the run directory."""
