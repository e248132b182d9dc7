"""The run: a session's correctness and benchmark stages, timed judging, the recorder, repro commands."""
