"""Shared fixtures for the harness's own tests."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


@pytest.fixture(scope="session")
def broken():
    import broken_backends
    return broken_backends
