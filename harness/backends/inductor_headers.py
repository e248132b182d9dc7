"""On the CPU, inductor's C++ kernels precompile every header they open with, not only torch's cpp_prefix.h.

Why: inductor (torch 2.13, torch/_inductor/codecache.py: CppCodeCache.load_async, CppPythonBindingsCodeCache.
_get_uncompiled_header) precompiles `torch/csrc/inductor/cpp_prefix.h` once per machine and `-include`s it, but
a compiled FlexAttention kernel opens with three more headers (ATen/native/cpu/utils.h, ATen/native/CPUBlas.h,
ATen/Context.h) that g++ parses again for every shape: 2.7 s of each ~5 s compile on this VM.

What this changes: the header precompiled for a kernel is the kernel's own leading `#include` lines, in their
order, so the translation unit g++ sees is unchanged (the kernel's own includes are then no-ops behind their
include guards) and so is the machine code: benchmarks/flex_header_study.py compares the disassembly both ways.
The compile cache's keys are not touched (inductor hashes the command line before the header is set), so a
kernel compiled either way is the same cache entry. A kernel that opens with cpp_prefix.h alone, or with
something else, keeps inductor's own header.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

#: inductor's own precompiled header for CPU kernels (codecache._get_cpp_prefix_header)
CPP_PREFIX = "torch/csrc/inductor/cpp_prefix.h"

_kernel_source = threading.local()  # the source load_async is compiling, for the header hook below
_installed: list[bool] = []


def leading_includes(source: str) -> list[str]:
    """The `#include` lines a C++ source opens with (blank lines skipped), up to its first other line."""
    lines = []
    for line in source.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#include"):
            break
        lines.append(stripped)
    return lines


def preamble_header(source: str, directory: str | os.PathLike) -> str | None:
    """The path of a header holding `source`'s leading includes (written once, named by its content), or None when
    they are not cpp_prefix.h followed by more: then inductor's own header already is the whole preamble."""
    includes = leading_includes(source)
    if len(includes) < 2 or includes[0] != f"#include <{CPP_PREFIX}>":
        return None
    text = "\n".join(includes) + "\n"
    path = Path(directory) / f"preamble-{hashlib.sha256(text.encode()).hexdigest()[:32]}.h"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # atomic: the other worker may be writing the same header
    return str(path)


def precompile_kernel_preambles() -> bool:
    """Install the hook in this process (once); False, and nothing changed, where this torch's inductor lacks the
    pieces it wraps or does not precompile headers at all."""
    if _installed:
        return _installed[0]
    try:
        from torch._inductor import codecache, config
    except ImportError:
        _installed.append(False)
        return False
    cache = getattr(codecache, "CppPythonBindingsCodeCache", None)
    parts = (getattr(cache, "load_async", None), getattr(cache, "_get_uncompiled_header", None),
             getattr(codecache, "_HEADER_DIR", None))
    if cache is None or None in parts or not getattr(config, "cpp_cache_precompile_headers", False):
        _installed.append(False)
        return False
    hook(cache, codecache._HEADER_DIR)
    _installed.append(True)
    return True


def hook(cache, header_dir: str | os.PathLike) -> None:
    """Wrap `cache`'s load_async (to note the source it compiles) and _get_uncompiled_header (to answer with that
    source's preamble header where it has one): inductor's load_async asks for the header while compiling."""
    load_async, own_header = cache.load_async.__func__, cache._get_uncompiled_header.__func__

    def load_async_noting_source(cls, main_code, *args, **kwargs):
        _kernel_source.code = main_code
        try:
            return load_async(cls, main_code, *args, **kwargs)
        finally:
            _kernel_source.code = None

    def uncompiled_header(cls, device):
        header = own_header(cls, device)
        code = getattr(_kernel_source, "code", None)
        if header != CPP_PREFIX or code is None:
            return header
        return preamble_header(code, header_dir) or header

    cache.load_async = classmethod(load_async_noting_source)
    cache._get_uncompiled_header = classmethod(uncompiled_header)
