"""Each backend's install facts are declared once, on its class: pyproject.toml's extras, setup.sh's steps, README's
first paragraph, pyproject's description and --help agree with them, and `backends --install` reads them."""

import re
from pathlib import Path

import pytest

from harness.backends.base import Backend, KnownFailure
from harness.backends.catalogue import ALL_EXTRA, extras, installs, libraries, prose, setup_step
from harness.backends.declaration import declaration_problems
from harness.backends.install import Install
from harness.backends.registry import all_backends, built_in_names
from harness.cli.node.setup_steps import steps
from harness.extras import EXTRAS
from harness.probes import edge_cases, empty

ROOT = Path(__file__).resolve().parents[3]
#: pyproject.toml's extras that install no backend's library: the optional dependencies' and the tests'
OTHER_EXTRAS = set(EXTRAS) | {"test"}


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="tomllib (Python >= 3.11) reads pyproject.toml")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_pyprojects_extras_are_the_declared_requirements_one_per_optional_backend_and_gpu_for_all():
    declared = extras()
    assert set(declared) == {"xformers", "flash-attn", "flash-attn-3", "flash-attn-4", "flashinfer", ALL_EXTRA}
    found = _pyproject()["project"]["optional-dependencies"]
    assert {k: v for k, v in found.items() if k not in OTHER_EXTRAS} == declared


def test_readme_pyproject_and_help_name_exactly_the_registrys_libraries(capsys):
    from harness.cli.main import main
    names = libraries()
    assert names == ["naive attention", "PyTorch SDPA", "FlexAttention", "xformers", "FlashAttention-2",
                     "FlashAttention-3", "FlashAttention-4", "FlashInfer"]
    listed = prose(names)  # the whole list as one phrase: a name more or less, or another order, breaks it
    first_paragraph = (ROOT / "README.md").read_text().split("\n\n")[1]
    assert listed in _one_line(first_paragraph)
    assert listed in _pyproject()["project"]["description"]
    assert main(["--help"]) == 0
    assert listed in _one_line(capsys.readouterr().out)


def test_setup_sh_installs_what_the_registry_says_and_pins_nothing_itself():
    setup = (ROOT / "setup.sh").read_text()
    assert "python -m harness.cli.node.setup_steps" in setup
    for install in installs().values():  # no requirement, no version of one: each is its backend's
        version = re.search(r"==(\S+)", install.requirement)
        assert install.requirement not in setup and (version is None or version.group(1) not in setup)
    wheelhouse = (ROOT / "harness" / "cli" / "node" / "wheelhouse.py").read_text()
    assert not [i.requirement for i in installs().values() if "==" in i.requirement and i.requirement in wheelhouse]


def test_setup_steps_on_a_cpu_machine_and_on_gpu_machines_of_cuda_12_and_13():
    cpu = {name: (what, how) for name, what, how in steps(gpu=False, torch_cuda=None)}
    assert cpu["xformers"] == ("install", "--no-deps xformers==0.0.35")
    assert cpu["flashinfer"][1].startswith("--no-deps flashinfer-python==0.6.1 apache-tvm-ffi==0.1.15.post2 einops")
    assert cpu["flash-attn-4"] == ("skip", "not installed on a machine without a GPU: "
                                           + installs()["flash-attn-4"].gpu_machine_only)
    for name in ("flash-attn", "flash-attn-3"):
        assert cpu[name] == ("skip", f"not installed: {installs()[name].builds_from_source}")
    cuda13 = {name: how for name, what, how in steps(gpu=True, torch_cuda="13.0") if what == "install"}
    assert cuda13["flash-attn-4"] == "flash-attn-4[cu13]==4.0.0b36"
    assert cuda13["xformers"] == "--no-deps xformers==0.0.35 nvidia-cuda-runtime-cu12"  # the runtime its _C.so links
    cuda12 = {name: how for name, what, how in steps(gpu=True, torch_cuda="12.8") if what == "install"}
    assert cuda12["flash-attn-4"] == "flash-attn-4==4.0.0b36" and cuda12["xformers"] == "--no-deps xformers==0.0.35"


def test_a_torch_the_library_has_no_build_for_is_one_line():
    fa4 = installs()["flash-attn-4"]
    for cuda, have in ((None, "a torch without CUDA"), ("11.8", "torch CUDA 11.8")):
        with pytest.raises(ValueError, match=f"^{have}: flash-attn-4==4.0.0b36 has builds for CUDA 12 and 13 only$"):
            fa4.requirement_for(cuda)
    assert setup_step(fa4, True, None) == ("not installed: a torch without CUDA: flash-attn-4==4.0.0b36 has builds "
                                           "for CUDA 12 and 13 only")


def test_the_wheelhouse_takes_each_librarys_declared_wheels():
    assert installs()["xformers"].wheels(13) == ("xformers==0.0.35", "nvidia-cuda-runtime-cu12")
    assert installs()["xformers"].wheels(12) == ("xformers==0.0.35",)
    fa4 = installs()["flash-attn-4"].wheels(12)
    assert fa4[0] == "nvidia-cutlass-dsl-libs-cu12==4.8.1" and "cuda-bindings==12.*" in fa4


@pytest.mark.parametrize("make, match", [
    (lambda: Install("xformers>=0.0.28,,", because="x"), "not a pip requirement"),
    (lambda: Install("flash-attn-4[cu13]==4.0.0b36", because="x"), "a CUDA flavour's extra goes in cuda_extras"),
    (lambda: Install("xformers==0.0.35", because=""), "say why this version"),
    (lambda: Install("flash-attn==2.8.3", because="x", builds_from_source="y", no_deps_with=()), "source build"),
    (lambda: KnownFailure("dropout", "p0", "why"), "probe='dropout'; allowed: empty, edge"),
    (lambda: KnownFailure("edge", "", "why"), "needs the case's name and why"),
])
def test_bad_install_facts_are_refused_in_one_line(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_declaration_with_a_bad_install_or_known_failure_is_a_problem():
    class Mine(Backend):
        name = "install-check"
        install = "xformers==0.0.35"
        known_failures = (KnownFailure("empty", "seq_q0", "why", device="gpu"),)

        def forward(self, q, k, v, *, mask, scale):
            return q

    problems = " ".join(declaration_problems(Mine))
    assert "install='xformers==0.0.35': must be None or an Install(" in problems
    assert "device 'gpu' not allowed; allowed: cpu, cuda" in problems


def test_every_known_failure_names_a_case_of_its_probe():
    cases = {empty.PROBE: set(empty.SHAPES), edge_cases.PROBE: {e.name for e in edge_cases.edge_cases("full")}}
    declared = [(name, f) for name, b in all_backends().items() if name in built_in_names() for f in b.known_failures]
    assert {(name, f.case) for name, f in declared} == {("naive", "fp16-qk-overflow"), ("naive", "fp16-large-v"),
                                                        ("flex", "seq_q0"), ("flex", "seq_k0")}
    assert all(f.case in cases[f.probe] for _, f in declared)
    flex = all_backends()["flex"]
    assert flex.known_failure("empty", "seq_q0", "cpu").startswith("compiled flex_attention kills the process")
    assert flex.known_failure("empty", "seq_q0", "cuda") is None and flex.known_failure("edge", "seq_q0", "cpu") is None


def test_backends_install_says_why_each_is_unavailable_and_what_installs_it(capsys):
    from harness.cli.main import main
    assert main(["backends", "--install", "--device", "cpu", "--backends", "sdpa-cudnn,flash-attn,flash-attn-4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "backends unavailable on cpu, and what would install them:"
    assert out[2].strip() == "-> nothing to install: it calls torch alone"
    assert out[4].strip() == f"-> {installs()['flash-attn'].builds_from_source}"
    assert out[6].strip() == "-> no build for this torch: a torch without CUDA: flash-attn-4==4.0.0b36 has builds for " \
                             "CUDA 12 and 13 only"
    assert out[-1] == "no pip command installs any of them here"


def test_backends_install_prints_the_pip_commands_of_what_is_missing(monkeypatch, capsys):
    import torch

    from harness.cli.backends import _install
    backends = all_backends()
    monkeypatch.setattr(type(backends["xformers"]), "installed_version", lambda self: None)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    chosen = [backends[n] for n in ("xformers", "flash-attn-4")]
    assert _install(chosen, {b.name: "not importable" for b in chosen}, torch.device("cuda")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == "python -m pip install --no-deps xformers==0.0.35 nvidia-cuda-runtime-cu12"
    assert out[-1] == f"python -m pip install 'flash-attn-4[cu13]==4.0.0b36' torch=={torch.__version__}"
