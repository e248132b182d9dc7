"""The preamble hook: a CPU kernel's precompiled header is exactly its own leading includes, or inductor's own.

Checked against torch 2.13.0, torch/_inductor/codecache.py: CppCodeCache.load_async calls
cls._get_uncompiled_header(device_type) while compiling main_code, and CppPythonBindingsCodeCache answers
"torch/csrc/inductor/cpp_prefix.h" on the CPU. That the machine code is unchanged is measured, not unit-tested:
benchmarks/flex_header_study.py (docs/measurements.md).
"""

from pathlib import Path

from harness.backends import inductor_headers
from harness.backends.inductor_headers import CPP_PREFIX, hook, leading_includes, preamble_header

FLEX_LIKE = f"""
#include <{CPP_PREFIX}>
#include <c10/util/Unroll.h>

#include <ATen/Context.h>
template <int N> inline void kernel() {{}}
#include <Python.h>
"""


def test_leading_includes_stop_at_the_first_other_line():
    assert leading_includes(FLEX_LIKE) == [f"#include <{CPP_PREFIX}>", "#include <c10/util/Unroll.h>",
                                           "#include <ATen/Context.h>"]
    assert leading_includes("int x;\n#include <a.h>\n") == []


def test_the_preamble_header_holds_those_lines_in_order_named_by_content(tmp_path):
    path = preamble_header(FLEX_LIKE, tmp_path)
    assert Path(path).read_text() == "\n".join(leading_includes(FLEX_LIKE)) + "\n"
    assert preamble_header(FLEX_LIKE + "\nint more;\n", tmp_path) == path  # same preamble, same header
    other = FLEX_LIKE.replace("ATen/Context.h", "ATen/native/CPUBlas.h")
    assert preamble_header(other, tmp_path) != path


def test_sources_inductors_own_header_already_covers_keep_it(tmp_path):
    assert preamble_header(f"#include <{CPP_PREFIX}>\nvoid kernel();\n", tmp_path) is None
    assert preamble_header("#include <ATen/Context.h>\n#include <Python.h>\n", tmp_path) is None  # not cpp_prefix
    assert list(tmp_path.iterdir()) == []


class FakeCache:
    """What the hook wraps of CppPythonBindingsCodeCache: load_async asks for the header while it compiles."""

    own = CPP_PREFIX

    @classmethod
    def _get_uncompiled_header(cls, device):
        return cls.own if device == "cpu" else None

    @classmethod
    def load_async(cls, main_code, device_type="cpu"):
        return cls._get_uncompiled_header(device_type)


def test_the_hook_answers_each_compile_with_its_own_preamble(tmp_path):
    class Cache(FakeCache):
        pass

    hook(Cache, tmp_path)
    header = Cache.load_async(FLEX_LIKE)
    assert header == preamble_header(FLEX_LIKE, tmp_path)
    assert Cache.load_async(f"#include <{CPP_PREFIX}>\nvoid k();\n") == CPP_PREFIX
    assert Cache.load_async(FLEX_LIKE, "cuda") is None  # a device inductor precompiles nothing for
    assert Cache._get_uncompiled_header("cpu") == CPP_PREFIX  # outside a compile: inductor's own

    class Wrapper(FakeCache):  # another code cache with its own header (CppWrapperCodeCache's cpp_wrapper/cpu.h)
        own = "torch/csrc/inductor/cpp_wrapper/cpu.h"

    hook(Wrapper, tmp_path)
    assert Wrapper.load_async(FLEX_LIKE) == Wrapper.own


def test_this_torch_has_what_the_hook_wraps():
    """A torch whose inductor lost these pieces would silently compile at the old cost: say so here first."""
    assert inductor_headers.precompile_kernel_preambles() is True
