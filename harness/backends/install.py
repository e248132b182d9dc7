"""How a backend's library installs (`Install`), declared once on its class; everything that installs reads it."""

from __future__ import annotations

from dataclasses import dataclass, field

from packaging.requirements import InvalidRequirement, Requirement

#: what `cuda` in an `offline` wheel's name stands for: the torch's CUDA major, e.g. 'nvidia-cutlass-dsl-libs-cu{cuda}'
CUDA = "{cuda}"


@dataclass(frozen=True)
class Install:
    """The library a backend calls, as pip installs it: pyproject.toml's extra (tests/unit/backends/test_install.py
    checks it), setup.sh (harness/cli/node/setup_steps.py), the wheelhouse and `python -m harness backends
    --install` read it. A backend without one (naive, sdpa, flex) calls torch alone."""

    #: the extra's requirement: the distribution with the one version it is tested with ('xformers==0.0.35')
    requirement: str
    #: why that version (what was read or run against it)
    because: str
    #: '' = a wheel on PyPI, installable on any Linux x86_64 machine; else how it builds instead (it then installs on a
    #: GPU node only, never by setup.sh, never in the wheelhouse)
    builds_from_source: str = ""
    #: '' = setup.sh installs it on a CPU machine too (its translation is tested against the real library there);
    #: else why setup.sh installs it on a GPU machine only
    gpu_machine_only: str = ""
    #: its kernels need a CUDA device (on a CPU it can only be imported)
    needs_gpu_to_run: bool = True
    #: None: installed with its dependencies (setup.sh holds the torch where it is with a constraint); a tuple:
    #: installed without them (so it never replaces a torch) together with these, what its import needs
    no_deps_with: tuple[str, ...] | None = None
    #: the library's own extra for each torch CUDA major it has a build for ('' = none needed); empty: one for all
    cuda_extras: dict[int, str] = field(default_factory=dict)
    #: what it needs beside a torch of this CUDA major (xformers' extension links libcudart.so.12)
    cuda_companions: dict[int, tuple[str, ...]] = field(default_factory=dict)
    #: the wheels an offline node needs when it installs with its dependencies, as pip resolves them (torch and
    #: typing-extensions aside), largest first, CUDA for the torch's CUDA major; empty: the requirement and no_deps_with
    offline_wheels: tuple[str, ...] = ()

    def __post_init__(self):
        try:
            req = Requirement(self.requirement)
        except InvalidRequirement as exc:
            raise ValueError(f"Install.requirement={self.requirement!r}: not a pip requirement ({exc})") from None
        if req.url or req.marker or req.extras:
            raise ValueError(f"Install.requirement={self.requirement!r}: a plain 'name==version' (no URL, marker or "
                             "extra; a CUDA flavour's extra goes in cuda_extras)")
        if not self.because:
            raise ValueError(f"Install({self.requirement!r}).because: say why this version")
        if self.builds_from_source and (self.no_deps_with is not None or self.offline_wheels):
            raise ValueError(f"Install({self.requirement!r}): a source build has no wheels to install without "
                             "dependencies or offline")

    @property
    def distribution(self) -> str:
        """The distribution's name, as the requirement spells it."""
        return Requirement(self.requirement).name

    def requirement_for(self, torch_cuda: str | None) -> str:
        """The requirement for a torch of CUDA `torch_cuda` (torch.version.cuda; None = a CPU torch), its CUDA
        flavour's extra included; a one-line ValueError where the library has no build for it."""
        if not self.cuda_extras:
            return self.requirement
        major = _major(torch_cuda)
        if major not in self.cuda_extras:
            have = "a torch without CUDA" if major is None else f"torch CUDA {torch_cuda}"
            majors = " and ".join(map(str, sorted(self.cuda_extras)))
            raise ValueError(f"{have}: {self.requirement} has builds for CUDA {majors} only")
        extra = self.cuda_extras[major]
        req = Requirement(self.requirement)
        return f"{req.name}{f'[{extra}]' if extra else ''}{req.specifier}"

    def pip_arguments(self, torch_cuda: str | None, gpu: bool) -> list[str]:
        """`pip install`'s arguments for it beside a torch of CUDA `torch_cuda` on a machine with (`gpu`) or without
        a GPU: --no-deps with what its import needs, or the requirement alone (its dependencies resolved by pip)."""
        companions = self.cuda_companions.get(_major(torch_cuda), ()) if gpu else ()
        if self.no_deps_with is None:
            return [self.requirement_for(torch_cuda), *companions]
        return ["--no-deps", self.requirement_for(torch_cuda), *self.no_deps_with, *companions]

    def wheels(self, torch_cuda: int) -> tuple[str, ...]:
        """What the wheelhouse downloads (each --no-deps) for a node whose torch has CUDA major `torch_cuda`."""
        if self.offline_wheels:
            return tuple(w.replace(CUDA, str(torch_cuda)) for w in self.offline_wheels)
        return (self.requirement, *(self.no_deps_with or ()), *self.cuda_companions.get(torch_cuda, ()))


def _major(torch_cuda: str | None) -> int | None:
    """The major of torch.version.cuda ('13.0' -> 13), None for a CPU torch."""
    return None if torch_cuda is None else int(str(torch_cuda).split(".")[0])
