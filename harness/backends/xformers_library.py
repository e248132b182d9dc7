"""Loading xformers: its extension's needs, why it does not load here in one line, which kernels it can pick."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
import warnings
from pathlib import Path
from typing import Callable

import torch
from torch.torch_version import TorchVersion

from harness.backends.flash_attn_package import NOT_INSTALLED, fa2_problem

#: what xformers 0.0.35's wheel was built with (cpp_lib.json), on torch's stable ABI only (docs/design/backends.md)
BUILT_FOR = "torch 2.10.0+cu128, on torch's stable ABI: loads with any torch >= 2.10 given libcudart.so.12"
#: the oldest torch whose stable ABI has every symbol _C.so imports (its build target)
STABLE_ABI_TORCH = "2.10"
#: the pip package whose nvidia/cuda_runtime/lib/libcudart.so.12 _C.so links (NEEDED libcudart.so.12)
CUDA12_RUNTIME_PACKAGE = "nvidia-cuda-runtime-cu12"
CUDA12_RUNTIME = Path("nvidia", "cuda_runtime", "lib", "libcudart.so.12")
#: the CUDA 12 runtime this process loaded for xformers (None: not needed or not found)
cuda12_runtime_loaded: Path | None = None


def find_cuda12_runtime() -> Path | None:
    """The pip-installed libcudart.so.12 on the import path (the venv's or the system python's), or None."""
    for entry in sys.path:
        candidate = Path(entry or ".", CUDA12_RUNTIME)
        if candidate.is_file():
            return candidate
    return None


def make_cuda12_runtime_visible(load: Callable[..., object] = ctypes.CDLL) -> Path | None:
    """Load the pip-installed CUDA 12 runtime before xformers when torch is not a CUDA 12 build, so that _C.so's
    NEEDED libcudart.so.12 resolves to it (the loader matches a loaded library by soname; no LD_LIBRARY_PATH). A CUDA
    12 torch has its own loaded (a second copy would sit beside it), and a CPU torch has no CUDA for _C.so."""
    global cuda12_runtime_loaded
    cuda = torch.version.cuda
    if cuda12_runtime_loaded is not None or cuda is None or cuda.split(".")[0] == "12":
        return cuda12_runtime_loaded
    path = find_cuda12_runtime()
    if path is not None:
        load(str(path), mode=ctypes.RTLD_GLOBAL)
        cuda12_runtime_loaded = path
    return path


@contextlib.contextmanager
def _hidden(module: str):
    """`module` unimportable inside the block (sys.modules[name] = None), what was there put back after."""
    before = sys.modules.get(module, _hidden)
    sys.modules[module] = None
    try:
        yield
    finally:
        if before is _hidden:
            del sys.modules[module]
        else:
            sys.modules[module] = before


def _import_xformers():
    """Import xformers, its load-failure warning kept off the terminal (it is the unavailable reason instead), the
    CUDA 12 runtime made visible first, and a `flash_attn` that is not FlashAttention-2 hidden meanwhile (xformers'
    flash.py would fail the whole import on it; hidden, xformers uses torch's bundled flash)."""
    if "xformers" not in sys.modules:  # xformers loads _C.so when its top package is first imported
        make_cuda12_runtime_visible()
    logger = logging.getLogger("xformers")
    disabled, logger.disabled = logger.disabled, True
    foreign = "xformers.ops" not in sys.modules and fa2_problem() not in (None, NOT_INSTALLED)
    try:
        with warnings.catch_warnings(), (_hidden("flash_attn") if foreign else contextlib.nullcontext()):
            warnings.simplefilter("ignore")
            import xformers
            import xformers.ops  # noqa: F401
    finally:
        logger.disabled = disabled
    return xformers


def load_problem() -> str | None:
    """Why xformers cannot run here (the loader's real words and what to install), or None when _C.so loaded."""
    try:
        xformers = _import_xformers()
    except Exception as exc:
        return f"xformers not importable: {type(exc).__name__}: {exc} (pip install 'attention-harness[xformers]')"
    if getattr(xformers, "_has_cpp_library", True):
        return None
    from xformers import _cpp_lib
    # the innermost exception of its `raise ... from` chain: xformers' xFormersInvalidLibException comes from torch's
    # OSError("Could not load this library: ..."), raised from ctypes' OSError carrying the loader's own words
    cause = _cpp_lib._cpp_library_load_exception
    while cause is not None and cause.__cause__ is not None:
        cause = cause.__cause__
    words = " ".join(str(cause or "unknown reason").split())[:300]
    said = f"{type(cause).__name__}: {words}" if cause is not None else words
    mine = f"xformers {xformers.__version__} could not load its extension _C.so ({said})"
    if TorchVersion(torch.__version__) < STABLE_ABI_TORCH:
        return (f"{mine}: torch {torch.__version__} is too old for it - the wheel is built on torch's stable ABI for "
                f"torch >= {STABLE_ABI_TORCH}: pip install 'torch>={STABLE_ABI_TORCH}' (with your CUDA), or the "
                f"xformers release built for torch {torch.__version__}")
    if torch.version.cuda is None:
        return f"{mine}: torch {torch.__version__} is a CPU build; the extension needs a CUDA torch"
    if "libcudart.so.12" in words:
        found = find_cuda12_runtime()
        where = (f"{found} is there but did not load" if found is not None else
                 f"torch {torch.__version__} (CUDA {torch.version.cuda}) does not ship it")
        return (f"{mine}: it links the CUDA 12 runtime and {where}: pip install {CUDA12_RUNTIME_PACKAGE} (the "
                "harness loads it from site-packages before xformers; no environment variable needed)")
    return f"{mine}; xformers' wheel: {BUILT_FOR}"


def xformers_kernels() -> str:
    """Which kernels xformers' attention ops run here, read from its modules (xformers 0.0.35 ops/fmha): fa2 (torch's
    bundled flash or the flash_attn package), cutlass (torch's aten._efficient_attention_*), fa3 (flash_attn_3)."""
    xformers = _import_xformers()
    from xformers.ops.fmha import cutlass, dispatch, flash, flash3
    if flash._USE_PT_FLASH_ATTN:
        fa2 = f"fa2F/fa2B = torch's bundled flash {flash.FLASH_VERSION} (aten._flash_attention_forward/backward)"
    elif flash.FLASH_VERSION != "0.0.0":
        fa2 = f"fa2F/fa2B = the flash_attn package {flash.FLASH_VERSION} (flash_attn_2_cuda)"
    else:
        fa2 = "fa2: none (this torch has no bundled flash and no FlashAttention-2 is installed)"
    cutlass_ops = ("cutlassF-pt/cutlassB-pt = torch's aten._efficient_attention_forward/backward"
                   if cutlass.FwOp.OPERATOR is not None
                   else "cutlass: none (torch's efficient-attention schema differs)")
    fa3 = ("fa3F/fa3B = the flash_attn_3 package" if flash3._C_flashattention3 is not None and dispatch._get_use_fa3()
           else "fa3: none (no flash_attn_3 package)")
    gate = "" if getattr(xformers, "_has_cpp_library", True) else "none runs until _C.so loads; "
    cudart = f"; loaded {cuda12_runtime_loaded}" if cuda12_runtime_loaded is not None else ""
    return f"{gate}{fa2}; {cutlass_ops}; {fa3}{cudart}"
