"""The attention suites: everything lives in the harness's pytest plugin."""

pytest_plugins = ["harness.suite.plugin"]
