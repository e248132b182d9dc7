"""The pytest plugin behind `pytest suites`: options, parametrization, the run session and the summary."""
