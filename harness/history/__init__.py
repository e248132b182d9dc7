"""History: the index of stored runs (Parquet or PostgreSQL), a testbed's noise model, change points and the trends page."""
