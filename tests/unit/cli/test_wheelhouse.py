"""The offline wheelhouse: the pip commands built for a target and the manifest, with pip replaced by a fake
runner (no network). The flags are pip 26's `pip download` options (--only-binary=:all: is required with
--platform/--python-version/--implementation/--abi); wheel names follow the wheel spec (name-version-tags.whl)."""

import hashlib
import json
import subprocess

import pytest

from harness.backends.catalogue import installs
from harness.cli.node import wheelhouse

#: the backends whose libraries have no wheel (FlashAttention-2 and -3): always left out, each with its reason
SOURCE_BUILDS = {name for name, install in installs().items() if install.builds_from_source}
#: FlashInfer's Python layer and what its import needs, each --no-deps (setup.sh installs the same)
FLASHINFER = {"flashinfer-python", "apache-tvm-ffi", "einops", "tabulate", "nvidia-ml-py", "tqdm", "click", "ninja",
              "requests", "urllib3", "idna", "certifi", "charset-normalizer"}


class FakePip:
    """Answers `pip wheel`/`pip download` by writing a wheel file per requirement into the destination."""

    def __init__(self, fail: str | None = None, extra: tuple[str, ...] = (), sizes: dict[str, int] | None = None):
        self.calls, self.fail, self.extra, self.sizes = [], fail, extra, sizes or {}

    def __call__(self, cmd, **kwargs):
        self.calls.append(cmd)
        dest = cmd[cmd.index("--dest") + 1] if "--dest" in cmd else cmd[cmd.index("--wheel-dir") + 1]
        req = cmd[-1]
        if self.fail and self.fail in req:
            return subprocess.CompletedProcess(cmd, 1, "", f"ERROR: Could not find a version that satisfies the "
                                                         f"requirement {req} (from versions: none)\nERROR: No matching "
                                                         f"distribution found for {req}\n")
        name = "attention_harness" if cmd[3] == "wheel" else req.split("=")[0].split(">")[0].replace("-", "_")
        with open(f"{dest}/{name}-1.0-py3-none-any.whl", "wb") as f:
            f.write(name.encode())
            if name in self.sizes:  # a sparse file of that size
                f.truncate(self.sizes[name])
        for extra in self.extra:
            open(f"{dest}/{extra}", "wb").close()
        return subprocess.CompletedProcess(cmd, 0, "", "")


def test_commands_for_a_cuda13_python312_node(tmp_path):
    cmds = dict(wheelhouse.commands(tmp_path, "3.12", "manylinux_2_28_x86_64", 13, full=False))
    assert cmds["attention-harness"][3:6] == ["wheel", "--no-deps", "--wheel-dir"]
    ruptures = cmds["ruptures>=1.1.8,<2"]
    assert ruptures[3:5] == ["download", "--no-deps"] and ruptures[-3:] == ["--dest", str(tmp_path), "ruptures>=1.1.8,<2"]
    flags = " ".join(ruptures)
    assert "--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312" in flags
    assert "--platform manylinux_2_28_x86_64" in flags and "--platform manylinux2014_x86_64" in flags
    assert "xformers==0.0.35" not in cmds  # the backends' libraries come after, each as its backend declares it
    assert not any("torch" in c for c in cmds) and not any("numpy" in c for c in cmds)
    full = dict(wheelhouse.commands(tmp_path, "3.12", "x", 12, full=True))
    scientific = full[" ".join(wheelhouse.SCIENTIFIC)]
    assert "--no-deps" not in scientific and scientific[-len(wheelhouse.SCIENTIFIC):] == list(wheelhouse.SCIENTIFIC)


#: FlashAttention-4's wheels for a CUDA 13 torch (as pip resolves flash-attn-4[cu13]==4.0.0b36, torch aside)
FA4 = {"flash-attn-4", "quack-kernels", "torch-c-dlpack-ext", "apache-tvm-ffi", "einops", "nvidia-cutlass-dsl",
       "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-core", "nvidia-cutlass-dsl-libs-cu13",
       "cuda-bindings", "cuda-pathfinder", "protobuf"}


def test_flash_attn_4_is_left_out_over_the_limit_in_one_line_and_taken_without_one(tmp_path):
    """Its CUTLASS DSL compiler (nvidia-cutlass-dsl-libs-cu13 4.8.1 for cp312: 91,954,433 bytes, pip download
    --no-deps, 2026-12-02) alone is over the lent machine's 64 MiB: the first download says so and the rest are not
    fetched; with --limit-mib 0 every wheel goes in."""
    sizes = {"nvidia_cutlass_dsl_libs_cu13": 91_954_433}
    pip = FakePip(sizes=sizes)
    found = wheelhouse.build(tmp_path / "lean", run=pip)
    line = found["left_out"]["flash-attn-4"]
    assert "\n" not in line and line.startswith("flash-attn-4 left out of the wheelhouse: with "
                                                "nvidia-cutlass-dsl-libs-cu13 (87.7 MiB) it would be 87.7 MiB, over "
                                                "--limit-mib 64")
    assert not (FA4 - FLASHINFER) & {w["name"] for w in found["wheels"]}  # FlashInfer's set shares two of them
    assert [c[-1] for c in pip.calls if "cutlass" in c[-1] or "flash-attn-4" in c[-1]] == [
        "nvidia-cutlass-dsl-libs-cu13==4.8.1"]
    assert sorted(p.name for p in (tmp_path / "lean").iterdir() if not p.name.endswith(".whl")) == ["manifest.json"]
    full = wheelhouse.build(tmp_path / "all", run=FakePip(sizes=sizes), limit_mib=0)
    assert set(full["left_out"]) == SOURCE_BUILDS and FA4 <= {w["name"] for w in full["wheels"]}
    assert "nvidia-cutlass-dsl-libs-cu12" not in {w["name"] for w in full["wheels"]}  # one compiler flavour


def test_flash_attn_4_without_a_wheel_for_the_target_is_left_out_with_pips_words(tmp_path):
    found = wheelhouse.build(tmp_path, python="3.9", run=FakePip(fail="quack-kernels"))
    assert found["left_out"]["flash-attn-4"].startswith("flash-attn-4 left out of the wheelhouse: no wheel of "
                                                        "quack-kernels>=0.5.3 for python 3.9, manylinux_2_28_x86_64: "
                                                        "pip says: ERROR: Could not find a version")
    assert not (FA4 - FLASHINFER) & {w["name"] for w in found["wheels"]} and "xformers" in {w["name"] for w in found["wheels"]}


def test_libraries_that_build_from_source_are_left_out_in_one_line_each(tmp_path):
    found = wheelhouse.build(tmp_path, run=FakePip())
    assert set(found["left_out"]) == SOURCE_BUILDS == {"flash-attn", "flash-attn-3"}
    for name in SOURCE_BUILDS:
        line = found["left_out"][name]
        assert "\n" not in line and line == f"{name} left out of the wheelhouse: {installs()[name].builds_from_source}"


def test_platforms_include_every_older_glibc_tag():
    tags = wheelhouse.platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and tags[-1] == "manylinux1_x86_64"
    assert "manylinux_2_29_x86_64" not in tags
    assert wheelhouse.platforms("macosx_14_0_arm64") == ["macosx_14_0_arm64"]


def test_manifest_names_versions_sizes_and_hashes(tmp_path):
    found = wheelhouse.build(tmp_path, run=FakePip())
    written = json.loads((tmp_path / "manifest.json").read_text())
    assert written == found and found["target"] == {"python": "3.12", "platform": "manylinux_2_28_x86_64",
                                                     "torch_cuda": 13, "full": False, "limit_mib": 64}
    assert set(found["left_out"]) == SOURCE_BUILDS  # these fake wheels are bytes: FlashAttention-4 fits
    by_name = {w["name"]: w for w in found["wheels"]}
    assert {"attention-harness", "xformers", "nvidia-cuda-runtime-cu12", "pytest-benchmark", "ruptures",
            "submitit", "py-cpuinfo", "cloudpickle", "hypothesis", "sortedcontainers"} | FA4 | FLASHINFER == set(by_name)
    x = by_name["xformers"]
    assert x["version"] == "1.0" and x["filename"] == "xformers-1.0-py3-none-any.whl" and x["size"] == 8
    assert x["sha256"] == hashlib.sha256(b"xformers").hexdigest()
    assert found["total_bytes"] == sum(w["size"] for w in found["wheels"])


def test_no_wheel_for_the_target_is_one_line_naming_package_and_target(tmp_path):
    with pytest.raises(ValueError) as refused:
        wheelhouse.build(tmp_path, python="3.14", run=FakePip(fail="ruptures"))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("no wheel of ruptures>=1.1.8,<2 for python 3.14, manylinux_2_28_x86_64, torch CUDA 13")
    assert "pip says: ERROR: Could not find a version that satisfies the requirement ruptures" in message


def test_a_torch_wheel_is_refused(tmp_path):
    with pytest.raises(ValueError, match="must not carry torch-2.11.0-cp312-cp312-linux_x86_64.whl"):
        wheelhouse.build(tmp_path, run=FakePip(extra=("torch-2.11.0-cp312-cp312-linux_x86_64.whl",)))


def test_an_nvidia_wheel_no_backend_declares_is_refused(tmp_path):
    cublas = "nvidia_cublas_cu12-12.8.4.1-py3-none-manylinux_2_27_x86_64.whl"
    with pytest.raises(ValueError, match=f"must not carry {cublas}"):
        wheelhouse.build(tmp_path, run=FakePip(extra=(cublas,)))


def test_cli_refuses_an_unknown_cuda_major_in_one_line(capsys):
    from harness.cli.main import main
    assert main(["wheelhouse", "/tmp/x", "--torch-cuda", "11"]) == 2
    assert "invalid choice: 11" in capsys.readouterr().err


def test_unmet_lists_what_an_offline_install_left_missing(monkeypatch):
    pytest.importorskip("submitit", reason="submitit (the optional 'slurm' extra, whose being met this test "
                                           "expects) is not installed")
    import importlib.metadata as md
    monkeypatch.setattr(md, "requires", lambda dist: ["pytest>=1", "no-such-dist-xyz>=1", "pytest<1",
                                                       'submitit>=1.5; extra == "slurm"', 'flash-attn; extra == "gpu"'])
    missing = wheelhouse.unmet()
    assert missing[0] == "no-such-dist-xyz>=1 (not installed)" and missing[1].startswith("pytest<1 (have ")
    assert len(missing) == 2  # the slurm extra is met; the gpu extra was not asked for
