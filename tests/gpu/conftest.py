"""Real-CUDA tests: marked `cuda`, skipped with the reason on a machine without a CUDA device."""

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
