"""`python -m harness backends`: every registered backend, whether it can run on this device, and why not."""

from __future__ import annotations

import argparse
import shlex

from harness.cli.options import add_to_argparse


def _backends(args: argparse.Namespace) -> int:
    from harness.backends.registry import get_backends
    from harness.isolation.plugin_host import load_backend_module
    from harness.calls.device import resolve_device
    for module in args.backend_module:
        load_backend_module(module)
    device = resolve_device(args.device)
    chosen = get_backends(args.backends)
    described = describe(chosen, device)
    reasons = {name: reason for name, (_, reason, _) in described.items()}
    if args.install:
        return _install([b for b in chosen if reasons[b.name] is not None], reasons, device)
    width = max(len(b.name) for b in chosen)
    print(f"backends on {device}:")
    for name, (version, reason, kernels) in described.items():
        state = "ok" if reason is None else "unavailable: " + reason
        print(f"  {name:<{width}}  {version:<14}  {state}")
        if kernels:  # indented under the line: what the backend's ops call underneath
            print(f"  {'':<{width}}  kernels: {kernels}")
    missing = any(reason is not None for reason in reasons.values())
    return 0 if args.backends == "all" or not missing else 1


def install_advice(backend, gpu: bool, torch_cuda: str | None) -> tuple[str, list[str]]:
    """What would make an unavailable `backend` installed here, from its `install` declaration: (one line, the pip
    arguments that install it: [] where pip cannot help, '--no-deps' first where it goes without dependencies)."""
    install = backend.install
    needs_gpu = install is not None and install.needs_gpu_to_run and not gpu
    if install is None:
        return "nothing to install: it calls torch alone", []
    if backend.installed_version() is not None:
        return f"{install.distribution} is installed" + ("; its kernels need a GPU" if needs_gpu else ""), []
    if install.builds_from_source:
        return install.builds_from_source, []
    try:
        arguments = install.pip_arguments(torch_cuda, gpu)
    except ValueError as exc:  # no build of it for this torch
        return f"no build for this torch: {exc}", []
    return "pip installs it (below)" + ("; then it imports, but its kernels need a GPU" if needs_gpu else ""), arguments


def _install(unavailable: list, reasons: dict[str, str], device) -> int:
    """Each unavailable backend, why, and what installs it; then the pip commands that install those pip can."""
    import torch
    print(f"backends unavailable on {device}, and what would install them:")
    if not unavailable:
        print("  none: every backend asked for can run here")
        return 0
    width = max(len(b.name) for b in unavailable)
    no_deps, with_deps = [], []
    for backend in unavailable:
        advice, arguments = install_advice(backend, device.type == "cuda", torch.version.cuda)
        print(f"  {backend.name:<{width}}  {reasons[backend.name]}\n  {'':<{width}}  -> {advice}")
        if arguments[:1] == ["--no-deps"]:
            no_deps += arguments[1:]
        else:
            with_deps += arguments
    pip = ["python", "-m", "pip", "install"]
    if no_deps:  # without dependencies: they never replace this torch
        print(shlex.join([*pip, "--no-deps", *dict.fromkeys(no_deps)]))
    if with_deps:  # with dependencies, this torch named so that pip keeps it
        print(shlex.join([*pip, *dict.fromkeys(with_deps), f"torch=={torch.__version__}"]))
    if not (no_deps or with_deps):
        print("no pip command installs any of them here")
    return 0


def available_here(backends: list, device) -> list:
    """The backends that can run on `device`, asked in workers as `describe` asks (none of their libraries loads in
    this process: the run's, where the verdicts are made)."""
    described = describe(backends, device)
    return [b for b in backends if described[b.name][1] is None]


def describe(backends: list, device) -> dict[str, tuple[str, str | None, str]]:
    """name -> (version, why it cannot run here or None, its kernels), asked where backend code may run: the
    built-ins together in one worker (their libraries - xformers, flash-attn, flashinfer - never load in this
    process; a listing judges nothing), each plugin in its own worker."""
    from harness.backends.registry import BUILT_IN, get_backends, modules_for
    from harness.isolation.executor import CallFailed, make_executor

    executor = make_executor(device, isolate=True)
    built_in = [b.name for b in backends if not modules_for(b.name) and type(b).__module__ in BUILT_IN]
    try:
        found = {}
        if built_in:
            host = get_backends([built_in[0]])[0]
            try:
                found.update(executor.run(host, _answers, device, built_in))
            except CallFailed as exc:
                found.update({name: (None, exc.failure.reason, "") for name in built_in})
        for backend in backends:
            if backend.name not in found:
                try:
                    found.update(executor.run(backend, _answers, device, [backend.name]))
                except CallFailed as exc:
                    found[backend.name] = (None, exc.failure.reason, "")
        return {b.name: (b.version(), found[b.name][1], found[b.name][2]) for b in backends}
    finally:
        executor.close()


def _answers(_, device, names: list[str]) -> dict[str, tuple[None, str | None, str]]:
    """In a worker: each named backend's unavailable_reason and kernels (a broken check is a reason too)."""
    from harness.backends.registry import all_backends
    from harness.calls.outcome import exception_text

    registry, out = all_backends(), {}
    for name in names:
        try:
            reason = registry[name].unavailable_reason(device)
        except Exception as exc:
            reason = f"availability check failed: {exception_text(exc)}"
        try:
            kernels = registry[name].kernels()
        except Exception:
            kernels = ""
        out[name] = (None, reason, kernels)
    return out


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser("backends", help="list backends, their versions, and why any cannot run here "
                                               "(exit 1 when a named one cannot)")
    add_to_argparse(p, "backends", "backend_module", "device")
    p.add_argument("--install", action="store_true",
                   help="instead: for each backend unavailable here, why, and the pip commands that install those pip "
                        "can (from each backend's declared install facts)")
    p.set_defaults(func=_backends)
