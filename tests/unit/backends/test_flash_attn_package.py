"""FlashAttention-2 is recognised by its interface module, and flash-attn-4's `flash_attn` namespace package
(flash_attn/cute/, no flash_attn/__init__.py) neither passes for it nor breaks the xformers backend.

Checked against xformers 0.0.35 ops/fmha/flash.py lines 56-58 (`if importlib.util.find_spec("flash_attn"): import
flash_attn; import flash_attn.flash_attn_interface`) and flash-attn 2.8.3 (flash_attn/__init__.py imports
flash_attn_interface, which imports the flash_attn_2_cuda extension)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.backends.flash_attn_package import FA4_NAMESPACE, fa2_problem
from harness.backends.registry import get_backends

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def fa4_namespace(tmp_path, monkeypatch):
    (tmp_path / "flash_attn" / "cute").mkdir(parents=True)
    (tmp_path / "flash_attn" / "cute" / "__init__.py").write_text("FA4 = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("flash_attn", "flash_attn.cute"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def test_fa4_namespace_is_not_fa2(fa4_namespace):
    assert importlib.util.find_spec("flash_attn") is not None  # the name alone would pass
    problem = fa2_problem()
    assert problem.startswith(FA4_NAMESPACE) and "holds cute" in problem
    reason = get_backends(["flash-attn"])[0].unavailable_reason(torch.device("cuda"))
    assert reason.startswith(FA4_NAMESPACE)


def test_fa4_namespace_breaks_xformers_flash_import_as_xformers_does_it(fa4_namespace):
    """What xformers' flash.py does at import, in its two lines: the name is found, the interface is not."""
    with pytest.raises(ModuleNotFoundError, match="flash_attn.flash_attn_interface"):
        if importlib.util.find_spec("flash_attn"):
            import flash_attn.flash_attn_interface  # noqa: F401


def test_a_regular_package_with_the_interface_is_fa2(tmp_path, monkeypatch):
    (tmp_path / "flash_attn").mkdir()
    for name in ("__init__.py", "flash_attn_interface.py"):
        (tmp_path / "flash_attn" / name).write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    assert fa2_problem() is None


def test_xformers_backend_imports_beside_fa4_and_leaves_flash_attn_importable(fa4_namespace):
    """A fresh interpreter (xformers is imported once per process): the backend's import of xformers.ops survives
    the namespace, xformers falls back as with no flash_attn, and flash_attn.cute still imports afterwards."""
    pytest.importorskip("xformers")
    code = ("from harness.backends.xformers_library import _import_xformers, xformers_kernels\n"
            "_import_xformers()\n"
            "from xformers.ops.fmha import flash\n"
            "import flash_attn.cute\n"
            "print('ok', flash.FLASH_VERSION, flash_attn.cute.FA4)\n")
    env = {"PYTHONPATH": f"{fa4_namespace}:{ROOT}", "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["ok", "0.0.0", "True"]
