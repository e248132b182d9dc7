"""Real-CUDA tests: marked `cuda`, skipped with the reason on a machine without a CUDA device."""

import sys

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    why = pytest.mark.skip(reason=f"no CUDA device (torch {torch.__version__}, "
                                  f"cuda build {torch.version.cuda or 'none'}): real-CUDA test")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(why)


def pytest_runtest_logreport(report):
    """A failure's traceback written as it happens: a GPU step killed at its timeout (the selftest's) still shows
    why each test before it failed (an H200 run of 2026-12-04 showed only 'F's)."""
    if report.failed:
        sys.stderr.write(f"\nFAILED {report.nodeid} ({report.when}):\n{report.longreprtext}\n")
        sys.stderr.flush()
