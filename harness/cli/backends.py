"""`python -m harness backends`: every registered backend, whether it can run on this device, and why not."""

from __future__ import annotations

import argparse

from harness.cli.options import add_to_argparse


def _backends(args: argparse.Namespace) -> int:
    from harness.backends.registry import get_backends, load_backend_module
    from harness.execution.device import resolve_device
    from harness.execution.executor import CallFailed, make_executor
    from harness.store.schema import ERROR
    for module in args.backend_module:
        load_backend_module(module)
    device = resolve_device(args.device)
    chosen = get_backends(args.backends)
    # each backend asked in its own worker: its library (xformers, flash-attn, flashinfer) never loads here
    executor = make_executor(device, isolate=True)
    width = max(len(b.name) for b in chosen)
    print(f"backends on {device}:")
    missing = 0
    try:
        for backend in chosen:
            refused = executor.refusal(backend, device)  # (error, why) when its worker could not start
            missing += refused is not None
            state = "ok" if refused is None else "unavailable: " + refused[1]
            print(f"  {backend.name:<{width}}  {backend.version():<14}  {state}")
            try:
                kernels = "" if refused and refused[0] == ERROR else executor.run(backend, _kernels, device)
            except CallFailed:
                kernels = ""
            if kernels:  # indented under the line: what the backend's ops call underneath
                print(f"  {'':<{width}}  kernels: {kernels}")
    finally:
        executor.close()
    return 0 if args.backends == "all" or not missing else 1


def _kernels(backend, device) -> str:
    """What the backend's calls can run here, asked where its code runs (a worker)."""
    return backend.kernels()


def add_subcommand(subparsers) -> None:
    p = subparsers.add_parser("backends", help="list backends, their versions, and why any cannot run here "
                                               "(exit 1 when a named one cannot)")
    add_to_argparse(p, "backends", "backend_module", "device")
    p.set_defaults(func=_backends)
