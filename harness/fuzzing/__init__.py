"""Fuzzing: the case space within a backend's declarations, drawing, shrinking a failure."""
