"""Shared fixtures and markers of the harness's own tests (tests/ mirrors the package: unit/<layer>/, e2e/, gpu/)."""

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
    """tests/e2e/ items carry the e2e marker (whole commands in subprocesses); tests/gpu/ items the cuda marker,
    skipped with the reason where no CUDA device is visible."""
    no_cuda = pytest.mark.skip(reason=f"needs a CUDA device; torch {torch.__version__} sees none")
    for item in items:
        parts = Path(str(item.path)).relative_to(ROOT).parts
        if parts[:2] == ("tests", "e2e"):
            item.add_marker(pytest.mark.e2e)
        if parts[:2] == ("tests", "gpu"):
            item.add_marker(pytest.mark.cuda)
            if not torch.cuda.is_available():
                item.add_marker(no_cuda)


@pytest.fixture(scope="session")
def broken():
    from tests.fixtures import broken_backends
    return broken_backends


@pytest.fixture
def torch_setting():
    """set(module, name, value): a torch config setting for one test, its value put back after. Not pytest's
    monkeypatch: it looks a module's attribute up in its __dict__, where torch's config values are not, so its undo
    deletes the setting, which torch's ConfigModule then hides for the rest of the session."""
    saved = []

    def set_(module, name, value):
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    yield set_
    for module, name, value in reversed(saved):
        setattr(module, name, value)
