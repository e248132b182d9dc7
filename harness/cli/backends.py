"""`python -m harness backends`: every registered backend, whether it can run on this device, and why not."""

from __future__ import annotations

import argparse

from harness.cli.options import add_to_argparse


def _backends(args: argparse.Namespace) -> int:
    from harness.backends.registry import get_backends, load_backend_module
    from harness.execution.device import resolve_device
    for module in args.backend_module:
        load_backend_module(module)
    device = resolve_device(args.device)
    chosen = get_backends(args.backends)
    width = max(len(b.name) for b in chosen)
    print(f"backends on {device}:")
    missing = 0
    for name, (version, reason, kernels) in describe(chosen, device).items():
        missing += reason is not None
        state = "ok" if reason is None else "unavailable: " + reason
        print(f"  {name:<{width}}  {version:<14}  {state}")
        if kernels:  # indented under the line: what the backend's ops call underneath
            print(f"  {'':<{width}}  kernels: {kernels}")
    return 0 if args.backends == "all" or not missing else 1


def describe(backends: list, device) -> dict[str, tuple[str, str | None, str]]:
    """name -> (version, why it cannot run here or None, its kernels), asked where backend code may run: the
    built-ins together in one worker (their libraries - xformers, flash-attn, flashinfer - never load in this
    process; a listing judges nothing), each plugin in its own worker."""
    from harness.backends.registry import BUILT_IN, get_backends, modules_for
    from harness.execution.executor import CallFailed, make_executor

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
    from harness.execution.outcome import exception_text

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
    p.set_defaults(func=_backends)
