"""Planning a run: the whole job's cost model."""
