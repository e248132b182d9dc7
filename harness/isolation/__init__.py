"""Process isolation: the executors, each backend's worker, the wire between them, a plugin's own process."""
