"""Why xformers' extension did not load, in the loader's own words, and the CUDA 12 runtime made visible first.

Checked against xformers 0.0.35 (xformers/_cpp_lib.py `_register_extensions`: `torch.ops.load_library(_C.so)`
inside `except OSError as exc: raise xFormersInvalidLibException(build_metadata) from exc`, the exception kept as
`_cpp_library_load_exception`; xformers/__init__.py `_has_cpp_library`) and torch 2.13 (torch/_ops.py
`load_library`: `ctypes.CDLL(path)` inside `except Exception as e: raise OSError(f"Could not load this library:
{path}") from e`). The chains below are built the same way, with the messages glibc's loader gives: the first
as seen on this machine (`_C.so` NEEDS libcudart.so.12), the second for a symbol `_C.so` imports (nm -D:
torch_new_list_reserve_size, part of the stable ABI the wheel targets)."""

import ctypes
import types

import pytest
import torch

from harness.backends import xformers_library as xformers_module

cpp_lib = pytest.importorskip("xformers._cpp_lib")

SO = "/site-packages/xformers/_C.so"


def _failed_load(loader_words: str) -> Exception:
    """xformers' exception for a _C.so that glibc refused with `loader_words`, chained as xformers and torch chain it."""
    build = cpp_lib._BuildInfo({"version": {"cuda": 1208, "hip": None, "torch": "2.10.0+cu128", "python": "3.10.19"},
                                "env": {}})
    try:
        try:
            try:
                raise OSError(loader_words)  # ctypes.CDLL's error
            except Exception as e:
                raise OSError(f"Could not load this library: {SO}") from e  # torch.ops.load_library
        except OSError as exc:
            raise cpp_lib.xFormersInvalidLibException(build) from exc  # xformers _register_extensions
    except cpp_lib.xFormersInvalidLibException as failure:
        return failure


@pytest.fixture
def failed_extension(monkeypatch):
    def fail(loader_words: str, torch_version: str, cuda: str | None):
        monkeypatch.setattr(xformers_module, "_import_xformers",
                            lambda: types.SimpleNamespace(_has_cpp_library=False, __version__="0.0.35"))
        monkeypatch.setattr(cpp_lib, "_cpp_library_load_exception", _failed_load(loader_words))
        monkeypatch.setattr(torch, "__version__", torch_version)
        monkeypatch.setattr(torch.version, "cuda", cuda)
        monkeypatch.setattr("sys.path", [])  # no pip CUDA runtime on the path
        return xformers_module.load_problem()
    return fail


def test_missing_cuda12_runtime_names_the_cause_and_the_package(failed_extension):
    problem = failed_extension("libcudart.so.12: cannot open shared object file: No such file or directory",
                               "2.11.0+cu130", "13.0")
    assert "(OSError: libcudart.so.12: cannot open shared object file: No such file or directory)" in problem
    assert "Could not load this library" not in problem and "xFormers was built for" not in problem
    assert "torch 2.11.0+cu130 (CUDA 13.0) does not ship it: pip install nvidia-cuda-runtime-cu12" in problem


def test_torch_older_than_the_stable_abi_target_gets_its_own_reason(failed_extension):
    problem = failed_extension(f"{SO}: undefined symbol: torch_new_list_reserve_size", "2.9.1+cu128", "12.8")
    assert "undefined symbol: torch_new_list_reserve_size" in problem
    assert "torch 2.9.1+cu128 is too old for it" in problem and "pip install 'torch>=2.10'" in problem
    assert "nvidia-cuda-runtime-cu12" not in problem


def test_the_built_for_note_no_longer_claims_another_torch_cannot_load_it():
    assert "stable ABI" in xformers_module.BUILT_FOR and ">= 2.10" in xformers_module.BUILT_FOR


def test_cuda12_runtime_is_loaded_by_path_with_rtld_global_for_a_cuda13_torch(tmp_path, monkeypatch):
    lib = tmp_path / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    monkeypatch.setattr("sys.path", ["", str(tmp_path / "elsewhere"), str(tmp_path)])
    monkeypatch.setattr(xformers_module, "cuda12_runtime_loaded", None)
    loads = []
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert xformers_module.make_cuda12_runtime_visible(lambda path, mode: loads.append((path, mode))) == lib
    assert loads == [(str(lib), ctypes.RTLD_GLOBAL)]
    xformers_module.make_cuda12_runtime_visible(lambda path, mode: loads.append(path))
    assert len(loads) == 1  # once per process


@pytest.mark.parametrize("cuda", ["12.8", None])
def test_cuda12_or_cpu_torch_loads_no_second_runtime(tmp_path, monkeypatch, cuda):
    lib = tmp_path / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    monkeypatch.setattr("sys.path", [str(tmp_path)])
    monkeypatch.setattr(xformers_module, "cuda12_runtime_loaded", None)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    loads = []
    assert xformers_module.make_cuda12_runtime_visible(lambda path, mode: loads.append(path)) is None and not loads


def test_kernels_say_which_library_each_op_family_calls():
    """On this CPU torch: no bundled flash, cutlass ops are torch's aten kernels, and none runs without _C.so."""
    kernels = get_xformers().kernels()
    assert "cutlassF-pt/cutlassB-pt = torch's aten._efficient_attention_forward/backward" in kernels
    assert "fa2" in kernels and "fa3" in kernels


def get_xformers():
    from harness.backends.registry import get_backends
    return get_backends(["xformers"])[0]


def test_an_extension_that_does_not_load_makes_the_backend_unavailable_with_xformers_own_cause(monkeypatch):
    """A wheel whose extension does not load (xformers/__init__.py `_has_cpp_library` False, the cause kept in
    xformers/_cpp_lib.py `_cpp_library_load_exception`): the backend is unavailable with that cause, not a guess."""
    from harness.backends.registry import get_backends

    fake = types.SimpleNamespace(_has_cpp_library=False, __version__="0.0.35")
    monkeypatch.setattr(xformers_module, "_import_xformers", lambda: fake)
    monkeypatch.setattr(cpp_lib, "_cpp_library_load_exception", OSError("libfoo.so: cannot open shared object"))
    problem = xformers_module.load_problem()
    assert "could not load its extension _C.so (OSError: libfoo.so: cannot open shared object)" in problem
    backend = get_backends(["xformers"])[0]
    assert backend.unavailable_reason(torch.device("cuda")) == problem  # unavailable, with xformers' words
